"""Linear probes on cached features: can a layer's representation predict a target?

* :mod:`.settings`  ``ProbeSettings`` and the targets of each kind of run (torch-free);
* :mod:`.targets`   class, old/new cohort and curvature-quantile targets; a regression's targets
  and target-quantile bins;
* :mod:`.linear`    the probes of a checkpoint's features, targets and splits (:func:`probe_features`);
* :mod:`.softmax`   one softmax-regression probe per seed with early stopping (:func:`probe_seeds`);
* :mod:`.ridge`     the closed-form ridge probe of a regression's targets, scored by R² (torch-free);
* :mod:`.ridge_classes` the closed-form ridge probe of class targets (``probes.kind: ridge``,
  scikit-learn's RidgeClassifier), many layers and seeds from one Gram matrix per layer;
* :mod:`.summary`   seeds and replicate indices reduced to the run's table (torch-free).

The names below are imported on first use (PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "ProbeSettings": "settings",
    "probe_targets": "settings",
    "class_target": "targets",
    "cohort_target": "targets",
    "quantile_target": "targets",
    "standard_targets": "targets",
    "select_targets": "targets",
    "select_regression_targets": "targets",
    "target_scalar": "targets",
    "RidgeFit": "ridge",
    "fit_ridge_path": "ridge",
    "ridge_seeds": "ridge",
    "class_ridge_rows": "ridge_classes",
    "fit_class_ridge": "ridge_classes",
    "ProbeFit": "softmax",
    "train_linear_probe": "softmax",
    "probe_seeds": "softmax",
    "probe_features": "linear",
    "probe_checkpoint": "linear",
    "stratified_split": "plan",
    "aggregate_seeds": "summary",
    "probe_summary": "summary",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
