"""Per-image input-loss curvature of every training image at a checkpoint.

* :mod:`.settings`     ``CurvatureSettings`` (torch-free: read while the workflow is planned);
* :mod:`.estimator`    the Hutchinson estimator with finite differences or exact Hessian-vector
  products (:func:`per_sample_curvature`) and its deterministic directions;
* :mod:`.distributed`  one shard over several processes (``torch.distributed``);
* :mod:`.io`           shard files, merging them into the per-image files, reading an epoch;
* :mod:`.dynamics`     per-sample loss dynamics over checkpoints (CSL, learning time) and the
  per-cohort curvature tables.

The names below are imported on first use (PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "DIRECTION_SCHEME": "settings",
    "CurvatureSettings": "settings",
    "per_sample_curvature": "estimator",
    "rademacher_directions": "directions",
    "full_fp32_precision": "estimator",
    "parallel_curvature": "distributed",
    "curvature_shard": "distributed",
    "write_shard": "io",
    "read_shard": "io",
    "merge_shards": "io",
    "read_epoch": "io",
    "sample_dynamics": "dynamics",
    "cohort_curvature": "dynamics",
    "run_tables": "dynamics",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
