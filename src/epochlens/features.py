"""Cached per-layer features of a checkpoint: forward hooks, representations, one HDF5 file per epoch.

Which layers: a *layer spec* is ``None`` (the default: every block output of the architecture, see
:func:`default_layers`) or a list of module names as in ``model.named_modules()`` (``"block2"``,
``"layer3.1"``, ``"layer3.1.conv2"``, ``"fc"``). A forward hook on each module turns its output
(B, C, H, W) or (B, D) into the representations of :mod:`epochlens.representations` as soon as the
module has run, so only one batch of activations is ever held and later in-place operations (ReLU)
cannot alter what is recorded. The model runs in eval mode without gradients, on a copy.

File layout (``features/epoch_{E}.h5``), written atomically (a killed job leaves no file)::

    /{split}/labels                    (N,)    int64   class labels of the split, in data order
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
(another checkpoint, another data set, another layer or representation spec, another dtype), saying
why. Batch size, device and compression are not part of the key: they change rounding at most.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import h5py
import numpy as np
import torch
from torch import nn

import epochlens
from epochlens import representations as reps
from epochlens.atomic import atomic_path
from epochlens.curvature import check_finite_weights
from epochlens.data import Dataset
from epochlens.device import model_device
from epochlens.errors import ConfigError, EpochlensError
from epochlens.progress import progress_bar
from epochlens.representations import RepresentationSettings

FORMAT = "epochlens-features"
#: Bump when the meaning of stored values changes (e.g. the default layers): old caches rebuild.
FORMAT_VERSION = 1
SPLITS = ("train", "test")


class FeatureError(EpochlensError):
    """A feature file that is unreadable or incomplete, or features that cannot be stored."""


class LayerError(EpochlensError):
    """A layer spec naming modules the model does not have, or modules unfit for hooking."""


@dataclass
class FeatureSettings:
    """What is extracted from each checkpoint and how it is stored."""

    layers: list[str] | None = field(
        default=None,
        metadata={
            "help": "module names to hook (as in model.named_modules()); None: every block output "
            "(SmallCNN: block1-3; ResNet18LoP: layer1.0 ... layer4.1)"
        },
    )
    representations: RepresentationSettings = field(
        default_factory=RepresentationSettings,
        metadata={"help": "pooled / stats / spectral and the spectral settings"},
    )
    dtype: Literal["float32", "float16"] = field(
        default="float32", metadata={"help": "storage dtype of the features (computed in float32)"}
    )
    splits: tuple[str, ...] = field(default=SPLITS, metadata={"help": "data splits to extract"})
    batch_size: int = field(
        default=256, metadata={"help": "images per forward pass; bounds activation memory"}
    )
    compression: Literal["gzip", "lzf", "none"] = field(
        default="gzip", metadata={"help": "HDF5 filter (gzip is readable by every HDF5 tool)"}
    )
    compression_level: int = field(default=4, metadata={"help": "gzip level 1-9"})

    def __post_init__(self) -> None:
        if isinstance(self.representations, Mapping):
            self.representations = RepresentationSettings(**self.representations)
        if isinstance(self.layers, str):
            self.layers = [self.layers]
        if self.layers is not None:
            self.layers = list(self.layers)
        self.splits = tuple(self.splits)
        problems = []
        if self.layers is not None and not self.layers:
            problems.append("layers is an empty list (use null for the default block outputs)")
        if self.layers is not None and len(set(self.layers)) != len(self.layers):
            problems.append(f"layers {self.layers} names a module twice")
        if self.dtype not in ("float32", "float16"):
            problems.append(f"dtype={self.dtype!r} must be float32 or float16")
        bad_splits = [s for s in self.splits if s not in SPLITS]
        if bad_splits or not self.splits or len(set(self.splits)) != len(self.splits):
            problems.append(f"splits={list(self.splits)} must be distinct values of {list(SPLITS)}")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if self.compression not in ("gzip", "lzf", "none"):
            problems.append(f"compression={self.compression!r} must be gzip, lzf or none")
        if not 1 <= self.compression_level <= 9:
            problems.append(f"compression_level={self.compression_level} must be 1..9")
        if problems:
            raise ConfigError("feature settings: " + "; ".join(problems) + ". Fix the config.")

    def spec(self) -> dict:
        """What the stored values depend on besides checkpoint and data (part of the cache key)."""
        return {
            "format_version": FORMAT_VERSION,
            "layers": "default_blocks" if self.layers is None else list(self.layers),
            "representations": self.representations.spec(),
            "dtype": self.dtype,
            "splits": list(self.splits),
        }


# ---------------------------------------------------------------------------------------------
# Layer specs


def default_layers(model: nn.Module) -> list[str]:
    """Every block output of ``model``, in forward order.

    * ``SmallCNN``: ``block1``, ``block2``, ``block3`` (each conv-BN-ReLU).
    * ``ResNet18LoP``: the eight basic blocks ``layer1.0``, ``layer1.1``, ..., ``layer4.1``.
    * Any other model: its direct children that hold parameters, except a final ``nn.Linear``
      (the classifier head).
    """
    name = type(model).__name__
    modules = dict(model.named_modules())
    if name == "SmallCNN":
        return ["block1", "block2", "block3"]
    if name == "ResNet18LoP":
        return [f"layer{i}.{j}" for i in range(1, 5) for j in range(2) if f"layer{i}.{j}" in modules]
    children = [(n, m) for n, m in model.named_children() if any(True for _ in m.parameters())]
    if children and isinstance(children[-1][1], nn.Linear):
        children = children[:-1]
    if not children:
        raise LayerError(
            f"{name} has no child modules with parameters to use as default layers; name the "
            f"layers explicitly (available: {_short(available_layers(model), 40)})."
        )
    return [n for n, _ in children]


def available_layers(model: nn.Module) -> list[str]:
    """Every hookable module name of ``model`` (``named_modules`` without the root)."""
    return [n for n, _ in model.named_modules() if n]


def resolve_layers(model: nn.Module, layers: Sequence[str] | None) -> list[str]:
    """Module names of a layer spec; None gives :func:`default_layers`.

    Raises:
        LayerError: a name the model does not have (listing the available ones) or a repeated name.
    """
    if layers is None:
        return default_layers(model)
    layers = [layers] if isinstance(layers, str) else list(layers)
    names = available_layers(model)
    unknown = [n for n in layers if n not in set(names)]
    if unknown:
        raise LayerError(
            f"{type(model).__name__} has no layer(s) {unknown}. Available layers: {_short(names, 80)}. "
            f"Default (block outputs): {default_layers(model)}. Fix features.layers in the config."
        )
    if len(set(layers)) != len(layers):
        raise LayerError(f"layer spec {layers} names a module twice; list each layer once.")
    return layers


# ---------------------------------------------------------------------------------------------
# Hooks and extraction


class _Capture:
    """Forward hooks that turn each layer's output into representations (on its device)."""

    def __init__(self, net: nn.Module, layers: Sequence[str], settings: RepresentationSettings) -> None:
        self.settings = settings
        self.out: dict[str, dict[str, torch.Tensor]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.calls: dict[str, int] = {}
        modules = dict(net.named_modules())
        self.handles = [modules[name].register_forward_hook(self._hook(name)) for name in layers]
        self.layers = list(layers)

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            if not isinstance(output, torch.Tensor) or output.ndim < 2:
                what = type(output).__name__
                if isinstance(output, torch.Tensor):
                    what += f" of shape {tuple(output.shape)}"
                raise LayerError(
                    f"layer {name!r} ({type(module).__name__}) returns {what}, not a (batch, ...) "
                    "tensor; hook another module (e.g. its parent block)."
                )
            self.shapes[name] = tuple(output.shape[1:])
            self.out[name] = reps.compute(output.float(), self.settings)

        return hook

    def run(self, net: nn.Module, x: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        self.out, self.calls = {}, {}
        net(x)
        for name in self.layers:
            calls = self.calls.get(name, 0)
            if calls != 1:
                raise LayerError(
                    f"layer {name!r} ran {calls} times in one forward pass; its output is ambiguous "
                    "(a module reused inside the model, or not used at all). Hook a module that runs "
                    "exactly once, such as the enclosing block."
                )
        return self.out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@contextmanager
def _prepared(
    model: nn.Module, device: torch.device | str | None
) -> Iterator[tuple[nn.Module, torch.device]]:
    device = model_device(model, device)
    net = copy.deepcopy(model).to(device).eval().requires_grad_(False)
    check_finite_weights(net)
    yield net, device


BatchFn = Callable[[int, int], torch.Tensor]


def iter_feature_batches(
    model: nn.Module,
    batches: BatchFn,
    n_samples: int,
    layers: Sequence[str],
    settings: RepresentationSettings,
    batch_size: int,
    device: torch.device | str | None = None,
    progress: bool = False,
    desc: str = "features",
) -> Iterator[tuple[int, int, dict[str, dict[str, np.ndarray]], dict[str, tuple[int, ...]]]]:
    """Yield ``(lo, hi, features, shapes)`` per batch of samples lo..hi.

    ``batches(lo, hi)`` returns the normalised inputs (hi - lo, C, H, W); ``features[layer][rep]``
    is a float32 array (hi - lo, d); ``shapes[layer]`` the per-sample activation shape.
    """
    with _prepared(model, device) as (net, dev):
        capture = _Capture(net, layers, settings)
        bar = progress_bar(total=n_samples, unit="image", disable=not progress, desc=desc)
        try:
            with torch.no_grad():
                for lo in range(0, n_samples, batch_size):
                    hi = min(lo + batch_size, n_samples)
                    x = batches(lo, hi).to(dev, torch.float32, non_blocking=True)
                    out = capture.run(net, x)
                    host = {layer: {r: t.cpu().numpy() for r, t in out[layer].items()} for layer in layers}
                    yield lo, hi, host, dict(capture.shapes)
                    bar.update(hi - lo)
        finally:
            capture.close()
            bar.close()


def extract_features(
    model: nn.Module,
    images: torch.Tensor | np.ndarray,
    layers: Sequence[str] | None = None,
    settings: RepresentationSettings | None = None,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> dict[str, dict[str, np.ndarray]]:
    """In-memory features of ``images`` (N, C, H, W), already normalised.

    Returns ``features[layer][representation]`` float32 arrays (N, d), layers resolved by
    :func:`resolve_layers`. For large data sets use :func:`load_or_extract`, which streams to disk.
    """
    settings = settings or RepresentationSettings()
    images = torch.as_tensor(images)
    names = resolve_layers(model, layers)
    if len(images) == 0:
        raise ValueError("images is empty: nothing to extract")
    parts: dict[str, dict[str, list[np.ndarray]]] = {n: {} for n in names}
    for _, _, feats, _ in iter_feature_batches(
        model, lambda lo, hi: images[lo:hi], len(images), names, settings, batch_size, device, progress
    ):
        for layer, by_rep in feats.items():
            for r, arr in by_rep.items():
                parts[layer].setdefault(r, []).append(arr)
    return {layer: {r: np.concatenate(a) for r, a in by_rep.items()} for layer, by_rep in parts.items()}


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
        """(N,) int64 class labels of ``split``."""
        self._check(split)
        with h5py.File(self.path, "r") as f:
            return f[f"{split}/labels"][()].astype(np.int64)

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
        checkpoint_sha256: hash of the checkpoint file (``checkpoints.file_sha256``).
        settings: layers, representations, dtype, splits (defaults: block outputs, all
            representations, float32, train and test).
        device: "auto", "cpu", "cuda", ... or a torch.device; None: the model's device.
        progress: progress bar over images.

    Returns:
        :class:`CacheResult` with the :class:`FeatureSet`, whether it was a hit and why not.
    """
    t0 = time.perf_counter()
    settings = settings or FeatureSettings()
    spec = settings.spec()
    dkey = data_key(data)
    hit, reason = cache_status(path, checkpoint_sha256, dkey, spec)
    if hit:
        try:
            return CacheResult(FeatureSet(path), True, reason, time.perf_counter() - t0)
        except FeatureError as exc:
            reason = f"cached file incomplete ({exc})"
    net = model() if callable(model) and not isinstance(model, nn.Module) else model
    write_features(path, net, data, checkpoint_sha256, settings, device, progress, _data_key=dkey)
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
    store = np.dtype(settings.dtype)
    filters: dict = {}
    if settings.compression != "none":
        filters = {"compression": settings.compression, "shuffle": True}
        if settings.compression == "gzip":
            filters["compression_opts"] = settings.compression_level
    run_device = model_device(model, device)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for split in settings.splits:
            n = len(data.labels(split))
            if n == 0:
                raise FeatureError(f"{path}: split {split!r} of data set {data.name!r} is empty.")
            group = f.create_group(split)
            group.create_dataset("labels", data=data.labels(split).astype(np.int64))
            writer: _ChunkWriter | None = None
            for lo, hi, feats, shapes in iter_feature_batches(
                model,
                lambda lo, hi, split=split: data.normalized(split, np.arange(lo, hi)),
                n,
                layers,
                settings.representations,
                settings.batch_size,
                run_device,
                progress,
                desc=f"features {split}",
            ):
                if writer is None:
                    writer = _ChunkWriter(group, feats, shapes, n, store, filters, settings)
                writer.add(lo, hi, _to_storage(feats, store, path, split, lo))
            assert writer is not None
            writer.flush()
        f.attrs.update(
            format=FORMAT,
            format_version=FORMAT_VERSION,
            cache_key=cache_key(checkpoint_sha256, _data_key or data_key(data), settings.spec()),
            checkpoint_sha256=checkpoint_sha256,
            data_key=_data_key or data_key(data),
            data_content_hash=data.content_hash,
            spec=json.dumps(settings.spec(), sort_keys=True),
            layers=json.dumps(layers),
            representations=json.dumps(list(settings.representations.names)),
            splits=json.dumps(list(settings.splits)),
            dtype=settings.dtype,
            model_class=type(model).__name__,
            device=str(run_device),
            compute_seconds=time.perf_counter() - t0,
            created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            epochlens_version=epochlens.__version__,
            torch_version=str(torch.__version__),
        )


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
                    ds.attrs["spectral_method"] = reps.spectral_method_for(
                        shapes[layer], settings.representations
                    )
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


def _short(items: list, n: int = 10) -> str:
    return str(list(items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")
