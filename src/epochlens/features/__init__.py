"""Cached per-layer features of every training and test image at a checkpoint.

* :mod:`.settings`         ``FeatureSettings``, ``RepresentationSettings`` (torch-free);
* :mod:`.representations`  pooled, stats and spectral representations of one activation;
* :mod:`.extract`          forward hooks and batched extraction (:func:`extract_features`);
* :mod:`.cache`            the per-epoch HDF5 file, its cache key and :class:`FeatureSet`.

Probes on the features are :mod:`epochlens.probes`. The names below are imported on first use
(PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "FeatureSettings": "settings",
    "RepresentationSettings": "settings",
    "extract_features": "extract",
    "iter_feature_batches": "extract",
    "FeatureSet": "cache",
    "CacheResult": "cache",
    "load_or_extract": "cache",
    "write_features": "cache",
    "cache_key": "cache",
    "cache_status": "cache",
    "data_key": "cache",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
