"""Linear probes on cached features: can a layer's representation predict a target?

* :mod:`.settings`  ``ProbeSettings`` (torch-free);
* :mod:`.targets`   class, old/new cohort and curvature-quantile targets;
* :mod:`.linear`    softmax-regression probes with early stopping (:func:`probe_features`);
* :mod:`.summary`   seeds and replicate indices reduced to the run's table (torch-free).

The names below are imported on first use (PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "ProbeSettings": "settings",
    "class_target": "targets",
    "cohort_target": "targets",
    "quantile_target": "targets",
    "standard_targets": "targets",
    "select_targets": "targets",
    "ProbeFit": "linear",
    "train_linear_probe": "linear",
    "probe_seeds": "linear",
    "probe_features": "linear",
    "probe_checkpoint": "linear",
    "stratified_split": "linear",
    "aggregate_seeds": "summary",
    "probe_summary": "summary",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
