"""Cached per-layer features of a checkpoint: one HDF5 file per epoch, with its cache key.

Features are extracted by :mod:`epochlens.features.extract` (forward hooks, representations).

File layout (``features/epoch_{E}.h5``), written atomically (a killed job leaves no file)::

    /{split}/labels                    (N,)    int64   class labels of the split, in data order
                                       (a regression's: its float targets (N,) or (N, D) as stored)
    /{split}/{layer}/{representation}  (N, d)  float16 or float32, chunked (rows), compressed
        attrs: activation_shape (C, H, W) or (D,), columns (JSON; stats only), spectral_method
    attrs: format, format_version, cache_key, checkpoint_sha256, data_key, data_content_hash,
           spec (JSON: requested layers, representations and their settings, dtype, splits),
           layers (JSON: resolved module names), representations (JSON), splits (JSON), dtype,
           model_class, device, compute_seconds, created_utc, epochlens_version, torch_version

``split`` is ``train`` and/or ``test``; all samples of a split, in data order (probes select the
holdout or the classes they need). d is C for ``pooled``, 6 for ``stats``, k for ``spectral``.

Cache: the key is the SHA-256 of (checkpoint file hash, data key, spec). The data key hashes the
images and labels (``Dataset.content_hash``) and the normalisation (scale, mean, std): both change
the features. :func:`load_or_extract` reads the file when its key matches and rebuilds it otherwise
(another checkpoint, another data set, another layer or representation spec, another dtype or
forward precision), saying why. Batch size, device and compression are not part of the key: they
change rounding at most.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import nn

import epochlens
from epochlens.atomic_hdf5 import atomic_h5
from epochlens.data import Dataset
from epochlens.device import model_device
from epochlens.errors import FeatureError, LayerError
from epochlens.features import representations as reps
from epochlens.features.extract import iter_feature_batches
from epochlens.features.settings import FORMAT_VERSION, FeatureSettings
from epochlens.features.spectral import spectral_method_for
from epochlens.models.layers import resolve_layers

FORMAT = "epochlens-features"


# ---------------------------------------------------------------------------------------------
# Cache keys


def data_key(data: Dataset) -> str:
    """SHA-256 of the data's content hash and its normalisation (both change the features)."""
    payload = json.dumps(
        {
            "content_hash": data.content_hash,
            "scale": float(data.scale),
            "mean": [float(v) for v in data.mean],
            "std": [float(v) for v in data.std],
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def cache_key(checkpoint_sha256: str, data_hash: str, spec: Mapping) -> str:
    """SHA-256 of the canonical JSON of (checkpoint hash, data key, spec)."""
    payload = json.dumps(
        {"checkpoint_sha256": checkpoint_sha256, "data_key": data_hash, "spec": spec}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def cache_status(path: str | Path, checkpoint_sha256: str, data_hash: str, spec: Mapping) -> tuple[bool, str]:
    """Whether ``path`` holds the features of this key, and why not: ``(hit, reason)``."""
    path = Path(path)
    if not path.exists():
        return False, "no cached file"
    try:
        with h5py.File(path, "r") as f:
            attrs = {k: f.attrs[k] for k in ("format", "cache_key", "checkpoint_sha256", "data_key", "spec")}
    except (OSError, KeyError) as exc:
        return False, f"cached file unreadable or incomplete ({type(exc).__name__}: {str(exc)[:120]})"
    if str(attrs["format"]) != FORMAT:
        return False, f"not an {FORMAT} file"
    if str(attrs["cache_key"]) == cache_key(checkpoint_sha256, data_hash, spec):
        return True, "cache hit"
    changed = []
    if str(attrs["checkpoint_sha256"]) != checkpoint_sha256:
        changed.append("checkpoint changed")
    if str(attrs["data_key"]) != data_hash:
        changed.append("data changed")
    stored_spec = json.loads(str(attrs["spec"]))
    if stored_spec != json.loads(json.dumps(spec)):
        diff = sorted(k for k in set(stored_spec) | set(spec) if stored_spec.get(k) != spec.get(k))
        changed.append(f"spec changed ({', '.join(diff)})")
    return False, "; ".join(changed) or "cache key changed"


# ---------------------------------------------------------------------------------------------
# Reading


class FeatureSet:
    """Read access to a features file; arrays are read on demand (the file is not kept open)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with h5py.File(self.path, "r") as f:
                self.attrs = {k: _attr(v) for k, v in f.attrs.items()}
                fmt = self.attrs.get("format")
                if fmt != FORMAT:
                    raise KeyError(f"format attribute is {fmt!r}, not {FORMAT!r}")
                self.layers: list[str] = json.loads(self.attrs["layers"])
                self.representations: list[str] = json.loads(self.attrs["representations"])
                self.splits: list[str] = json.loads(self.attrs["splits"])
                for split in self.splits:
                    for layer in self.layers:
                        for r in self.representations:
                            f[f"{split}/{layer}/{r}"]  # noqa: B018 (presence check)
        except (OSError, KeyError) as exc:
            raise FeatureError(
                f"{self.path}: not a complete epochlens features file ({type(exc).__name__}: "
                f"{str(exc)[:200]}). Delete it and rerun the feature extraction for this epoch."
            ) from exc
        self.dtype: str = self.attrs["dtype"]

    def _check(self, split: str, layer: str | None = None, representation: str | None = None) -> None:
        if split not in self.splits:
            raise FeatureError(f"{self.path}: no split {split!r} (has {self.splits}); extract it.")
        if layer is not None and layer not in self.layers:
            raise LayerError(f"{self.path}: no layer {layer!r}; the file holds layers {self.layers}.")
        if representation is not None and representation not in self.representations:
            raise FeatureError(
                f"{self.path}: no representation {representation!r}; the file holds {self.representations}."
            )

    def labels(self, split: str) -> np.ndarray:
        """(N,) int64 class labels of ``split``, or a regression's float targets (N,) / (N, D) in
        their stored dtype."""
        self._check(split)
        with h5py.File(self.path, "r") as f:
            labels = f[f"{split}/labels"][()]
        return labels if np.issubdtype(labels.dtype, np.floating) else labels.astype(np.int64)

    def array(
        self, split: str, layer: str, representation: str, dtype: np.dtype | type | None = np.float32
    ) -> np.ndarray:
        """(N, d) features of one layer and representation (``dtype=None``: as stored)."""
        self._check(split, layer, representation)
        with h5py.File(self.path, "r") as f:
            arr = f[f"{split}/{layer}/{representation}"][()]
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def shape(self, layer: str) -> tuple[int, ...]:
        """Per-sample activation shape of ``layer``: (C, H, W) or (D,)."""
        self._check(self.splits[0], layer)
        with h5py.File(self.path, "r") as f:
            rep = self.representations[0]
            return tuple(int(v) for v in f[f"{self.splits[0]}/{layer}/{rep}"].attrs["activation_shape"])

    def load_all(self, dtype: np.dtype | type | None = None) -> dict[str, dict[str, dict[str, np.ndarray]]]:
        """Everything at once: ``out[split][layer][representation]`` (N, d)."""
        out: dict[str, dict[str, dict[str, np.ndarray]]] = {}
        with h5py.File(self.path, "r") as f:
            for split in self.splits:
                out[split] = {}
                for layer in self.layers:
                    out[split][layer] = {}
                    for r in self.representations:
                        arr = f[f"{split}/{layer}/{r}"][()]
                        out[split][layer][r] = arr if dtype is None else arr.astype(dtype, copy=False)
        return out


def _attr(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass
class CacheResult:
    """What :func:`load_or_extract` did."""

    features: FeatureSet
    hit: bool  # True: read from the cache; False: extracted and written
    reason: str  # "cache hit", or why the file was (re)built
    seconds: float  # wall time of the call


def load_or_extract(
    path: str | Path,
    model: nn.Module | Callable[[], nn.Module],
    data: Dataset,
    checkpoint_sha256: str,
    settings: FeatureSettings | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> CacheResult:
    """Features of a checkpoint from ``path`` if cached under the same key, else extracted and written.

    Args:
        path: the features file (``features/epoch_{E}.h5``).
        model: the model with the checkpoint loaded, or a function returning it (called only on a
            cache miss, so a hit does not load the checkpoint).
        data: the data set; images are normalised batch by batch (memory bounded by batch size).
        checkpoint_sha256: hash of the checkpoint file (``provenance.file_sha256``).
        settings: layers, representations, dtype, splits (defaults: block outputs, all
            representations, float32, train and test).
        device: "auto", "cpu", "cuda", ... or a torch.device; None: the model's device.
        progress: progress bar over images.

    Returns:
        :class:`CacheResult` with the :class:`FeatureSet`, whether it was a hit and why not.
    """
    settings = settings or FeatureSettings()
    dkey = data_key(data)

    def write(net: nn.Module) -> None:
        write_features(path, net, data, checkpoint_sha256, settings, device, progress, _data_key=dkey)

    return cached_or_written(path, model, checkpoint_sha256, dkey, settings.spec(), write)


def cached_or_written(
    path: str | Path,
    model: nn.Module | Callable[[], nn.Module],
    checkpoint_sha256: str,
    data_key: str,
    spec: Mapping,
    write: Callable[[nn.Module], None],
) -> CacheResult:
    """The features file at ``path`` if it holds this (checkpoint, data, spec), else ``write(model)``
    (``model`` built first when it is a function: a hit loads no checkpoint)."""
    t0 = time.perf_counter()
    hit, reason = cache_status(path, checkpoint_sha256, data_key, spec)
    if hit:
        try:
            return CacheResult(FeatureSet(path), True, reason, time.perf_counter() - t0)
        except FeatureError as exc:
            reason = f"cached file incomplete ({exc})"
    write(model() if callable(model) and not isinstance(model, nn.Module) else model)
    return CacheResult(FeatureSet(path), False, reason, time.perf_counter() - t0)


def write_features(
    path: str | Path,
    model: nn.Module,
    data: Dataset,
    checkpoint_sha256: str,
    settings: FeatureSettings | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
    _data_key: str | None = None,
) -> None:
    """Extract the features of ``data`` and write them to ``path`` atomically (layout: module doc).

    Raises:
        LayerError: unknown layers (listing the available ones) or modules unfit for hooking.
        FeatureError: features that do not fit float16 (naming the layer) or are not finite.
    """
    settings = settings or FeatureSettings()
    layers = resolve_layers(model, settings.layers)
    t0 = time.perf_counter()
    run_device = model_device(model, device)

    def batches(split: str, n: int) -> Iterator:
        return iter_feature_batches(
            model,
            lambda lo, hi: data.normalized(split, np.arange(lo, hi)),
            n,
            layers,
            settings.representations,
            settings.batch_size,
            run_device,
            progress,
            desc=f"features {split}",
            precision=settings.precision,
        )

    dkey = _data_key or data_key(data)
    file_attrs = dict(format_version=FORMAT_VERSION, representations=list(settings.representations.names))
    write_feature_file(
        path, model, data, settings, batches, checkpoint_sha256, dkey, layers, run_device, t0, file_attrs
    )


def write_feature_file(
    path: str | Path,
    model: nn.Module,
    data,
    settings,
    batches: Callable[[str, int], Iterator[tuple[int, int, dict, dict]]],
    checkpoint_sha256: str,
    dkey: str,
    layers: list[str],
    run_device: torch.device,
    t0: float,
    extra: Mapping,
) -> None:
    """Write the features file at ``path`` atomically: every split (:func:`write_splits`) and the
    attributes its cache check and readers use (``extra``: format_version, representations and
    what a kind of data adds, e.g. a text run's tokenizer)."""
    with atomic_h5(path) as f:
        write_splits(f, path, data, settings, batches)
        attrs = file_attrs(
            data, settings, checkpoint_sha256, dkey, layers, type(model).__name__, str(run_device), t0, extra
        )
        f.attrs.update(attrs)


def file_attrs(
    data,
    settings,
    checkpoint_sha256: str,
    dkey: str,
    layers: list[str],
    model_class: str,
    device: str,
    t0: float,
    extra: Mapping,
) -> dict:
    """The attributes of a features file that its cache check and readers use, for a model's
    features or stored activations alike (``extra``: format_version, representations and what a
    kind of data or source adds)."""
    attrs = dict(
        format=FORMAT,
        cache_key=cache_key(checkpoint_sha256, dkey, settings.spec()),
        checkpoint_sha256=checkpoint_sha256,
        data_key=dkey,
        data_content_hash=data.content_hash,
        spec=json.dumps(settings.spec(), sort_keys=True),
        layers=json.dumps(layers),
        splits=json.dumps(list(settings.splits)),
        dtype=settings.dtype,
        model_class=model_class,
        device=device,
        compute_seconds=time.perf_counter() - t0,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        epochlens_version=epochlens.__version__,
        torch_version=str(torch.__version__),
    )
    attrs.update(extra)
    attrs["representations"] = json.dumps(list(attrs["representations"]))
    return attrs


def write_splits(
    f: h5py.File,
    path: str | Path,
    data,
    settings,
    batches: Callable[[str, int], Iterator[tuple[int, int, dict, dict]]],
) -> None:
    """Each split of ``settings.splits``: its labels and its features, streamed from
    ``batches(split, n)`` ((lo, hi, features, shapes) as :func:`iter_feature_batches` yields them)
    in whole compressed chunks, in the storage dtype (the layout of the module doc). ``data``: an
    image :class:`Dataset` or a text data set; ``settings``: dtype, compression, chunking."""
    store = np.dtype(settings.dtype)
    filters: dict = {}
    if settings.compression != "none":
        filters = {"compression": settings.compression, "shuffle": True}
        if settings.compression == "gzip":
            filters["compression_opts"] = settings.compression_level
    for split in settings.splits:
        n = len(data.labels(split))
        if n == 0:
            raise FeatureError(f"{path}: split {split!r} of data set {data.name!r} is empty.")
        group = f.create_group(split)
        labels = np.asarray(data.labels(split))  # a regression's float targets kept as they are
        group.create_dataset(
            "labels", data=labels if np.issubdtype(labels.dtype, np.floating) else labels.astype(np.int64)
        )
        writer: _ChunkWriter | None = None
        for lo, hi, feats, shapes in batches(split, n):
            if writer is None:
                writer = _ChunkWriter(group, feats, shapes, n, store, filters, settings)
            writer.add(lo, hi, _to_storage(feats, store, path, split, lo))
        assert writer is not None
        writer.flush()


def _to_storage(
    feats: dict[str, dict[str, np.ndarray]], store: np.dtype, path: str | Path, split: str, lo: int
) -> dict[str, dict[str, np.ndarray]]:
    """Cast to the storage dtype; refuse non-finite values and float16 overflow, naming the layer."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for layer, by_rep in feats.items():
        out[layer] = {}
        for r, arr in by_rep.items():
            finite = np.isfinite(arr)
            if not finite.all():
                rows = np.flatnonzero(~finite.all(1))[:10] + lo
                raise FeatureError(
                    f"{path}: layer {layer!r} gives non-finite {r} features for {split} samples "
                    f"{rows.tolist()}: the activations overflowed. Check the checkpoint and the data's "
                    "normalisation."
                )
            biggest = float(np.abs(arr).max()) if arr.size and store == np.float16 else 0.0
            if biggest > float(np.finfo(np.float16).max):
                raise FeatureError(
                    f"{path}: layer {layer!r} {r} features exceed the float16 range (max |value| "
                    f"{biggest:.3g} > 65504). Set features.dtype to float32."
                )
            out[layer][r] = arr.astype(store, copy=False)
    return out


class _ChunkWriter:
    """Buffers batches and writes whole chunks of rows (each chunk is compressed once)."""

    def __init__(
        self,
        group: h5py.Group,
        first: dict[str, dict[str, np.ndarray]],
        shapes: dict[str, tuple[int, ...]],
        n: int,
        store: np.dtype,
        filters: dict,
        settings: FeatureSettings,
    ) -> None:
        self.rows = min(n, max(settings.batch_size, 1024))
        self.datasets: dict[tuple[str, str], h5py.Dataset] = {}
        self.pending: dict[tuple[str, str], list[np.ndarray]] = {}
        for layer, by_rep in first.items():
            sub = group.create_group(layer)
            for r, arr in by_rep.items():
                d = arr.shape[1]
                ds = sub.create_dataset(r, shape=(n, d), dtype=store, chunks=(self.rows, d), **filters)
                ds.attrs["activation_shape"] = np.asarray(shapes[layer], dtype=np.int64)
                if r == "stats":
                    ds.attrs["columns"] = json.dumps(list(reps.STATS_COLUMNS))
                if r == "spectral":
                    ds.attrs["spectral_method"] = spectral_method_for(shapes[layer], settings.representations)
                self.datasets[(layer, r)] = ds
                self.pending[(layer, r)] = []
        self.start = 0  # first row not yet written
        self.buffered = 0

    def add(self, lo: int, hi: int, feats: dict[str, dict[str, np.ndarray]]) -> None:
        if lo != self.start + self.buffered:
            raise RuntimeError("batches must arrive in order")
        for layer, by_rep in feats.items():
            for r, arr in by_rep.items():
                self.pending[(layer, r)].append(arr)
        self.buffered += hi - lo
        if self.buffered >= self.rows:
            self.flush(whole_chunks=True)

    def flush(self, whole_chunks: bool = False) -> None:
        if self.buffered == 0:
            return
        count = (self.buffered // self.rows) * self.rows if whole_chunks else self.buffered
        for key, parts in self.pending.items():
            block = np.concatenate(parts)
            self.datasets[key][self.start : self.start + count] = block[:count]
            self.pending[key] = [block[count:]] if count < len(block) else []
        self.start += count
        self.buffered -= count
