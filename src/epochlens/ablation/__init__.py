"""Ablations of unit groups and their effect on old versus new classes.

* :mod:`.settings`  ``AblationSettings`` (torch-free);
* :mod:`.ablate`    unit groups, zero/mean ablation hooks and the per-checkpoint table;
* :mod:`.summary`   replicate indices reduced to the run's table (torch-free).

The names below are imported on first use (PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "MODES": "settings",
    "AblationSettings": "settings",
    "UnitGroup": "ablate",
    "unit_groups": "ablate",
    "unit_means": "ablate",
    "ablated": "ablate",
    "ablation_table": "ablate",
    "evaluation_images": "ablate",
    "reference_images": "ablate",
    "ablation_summary": "summary",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
