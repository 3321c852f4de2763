"""The data-quality study around the influence engine.

* :mod:`.corruption`  corrupted training data on purpose (label flips, a backdoor trigger);
* :mod:`.transforms`  query transforms (images: hflip, noise, crop; texts: token dropout, truncation);
* :mod:`.settings`    query and transform settings (torch-free);
* :mod:`.queries`     the test images whose predictions are attributed;
* :mod:`.score_queries`  the queries and their transformed inputs that the influence score jobs
  take (the engine, :mod:`epochlens.influence`, knows nothing of studies);
* :mod:`.poison`      TracIn over a class schedule, per-image signals and the detection tables
  (torch-free);
* :mod:`.detection`   how well each signal finds the corrupted images (AUROC, precision at k).

The names below are imported on first use (PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "corrupt": "corruption",
    "flip_labels": "corruption",
    "plant_trigger": "corruption",
    "apply_trigger": "corruption",
    "transform_queries": "transforms",
    "QuerySettings": "settings",
    "QueryTransformSettings": "settings",
    "select_queries": "queries",
    "accumulate_tracin": "epochlens.influence.accumulate",
    "study_signals": "poison",
    "roc_table": "poison",
    "top_ranked": "poison",
    "detection_tables": "poison",
    "detection_table": "detection",
    "baseline_signals": "detection",
    "transform_agreement": "detection",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
