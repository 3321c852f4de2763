"""Saving and loading fitted factors, with a cache key that says what they were fitted on.

A factors file (``factors.pt``, written atomically with :mod:`epochlens.atomic`) is a ``torch.save``
of plain containers, loadable with ``weights_only=True``::

    format   "epochlens-influence-factors-v1"
    key      JSON string: the cache key (see factor_cache_key)
    method, fisher, n_samples, timings (JSON), fit_settings (JSON: InfluenceSettings.factor_key())
    skipped  int64 (K,) global indices left out for NaN/Inf gradients
    underflow int64 (K,) global indices left out for gradients that vanished in the compute dtype
             (absent in files written before it; read as empty)
    compute_dtype  dtype of the forward/backward passes ("" in older files)
    layers   {name: {"meta": JSON (kind, out_dim, in_dim, has_bias, n_samples, solver, min_raw),
                     "activation_values" (in_dim,), "activation_vectors" (in_dim, in_dim),
                     "gradient_values" (out,), "gradient_vectors" (out, out), "corrected" (out, in_dim),
                     "diagonal" (out, in_dim), optionally "activation_cov", "gradient_cov":
                     float64 tensors, absent where the method has none}}

The cache key holds everything the factors depend on: the model's weights (SHA-256 of the state
dict, or of the checkpoint file), the training data used (SHA-256 of images, labels and indices),
the resolved layer names, the active classes, the task when it is not classification over the
active classes, and the settings of :meth:`InfluenceSettings.factor_key` (method, Fisher type, layer
patterns, compute dtype, seed, scheme). Damping and batch sizes are not
in it: the same factors serve any damping, pairwise and self-influence alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from epochlens.atomic import atomic_path, write_atomic
from epochlens.batches import is_dataset, reads_rows, sample_source
from epochlens.errors import FactorCacheError
from epochlens.influence.covariances import CovarianceSums, resolve_layers, resolve_task
from epochlens.influence.factors import CorrectionSums, InfluenceFactors, LayerFactors
from epochlens.influence.settings import InfluenceSettings
from epochlens.tasks import ClassificationTask, Task

FACTORS_FORMAT = "epochlens-influence-factors-v1"
SUMS_FORMAT = "epochlens-influence-sums-v1"
_TENSORS = (
    "activation_cov",
    "gradient_cov",
    "activation_values",
    "activation_vectors",
    "gradient_values",
    "gradient_vectors",
    "corrected",
    "diagonal",
)


def state_dict_sha256(model: nn.Module) -> str:
    """SHA-256 of a model's parameters and buffers (names, dtypes, shapes, values)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-dim too
    return h.hexdigest()


def _update_with_batch(h, batch) -> None:
    """Hash every tensor of a nested batch with its place in the structure (keys, positions)."""
    if isinstance(batch, torch.Tensor | np.ndarray):
        a = np.ascontiguousarray(torch.as_tensor(batch).detach().cpu().numpy())
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(batch, Mapping):
        for k in sorted(batch, key=str):
            h.update(f"<{k}>".encode())
            _update_with_batch(h, batch[k])
    elif isinstance(batch, tuple | list):
        h.update(f"[{len(batch)}]".encode())
        for v in batch:
            _update_with_batch(h, v)
    else:
        h.update(repr(batch).encode())


def data_sha256(
    images: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | None,
    sample_indices: np.ndarray | None,
) -> str:
    """SHA-256 of the images, labels and global indices a fit used.

    A Dataset/DataLoader (labels None) is read once, batch by batch, and every tensor hashed with its
    place in the batch; pass a known content hash to :func:`factor_cache_key` instead where reading
    the data set again is expensive.
    """
    h = hashlib.sha256()
    if is_dataset(images):
        source = sample_source(images, None, sample_indices, "factor cache key")
        for _, batch in source.batches(256):
            _update_with_batch(h, batch)
        arrays = (np.asarray(source.indices, dtype=np.int64),)
    else:
        x = images if reads_rows(images) else torch.as_tensor(images).detach().cpu().contiguous()
        y = np.zeros(0) if labels is None else np.asarray(torch.as_tensor(labels).cpu().numpy())
        arrays = (
            _RowBytes(x) if reads_rows(x) else x.numpy(),
            y.astype(np.int64) if np.issubdtype(y.dtype, np.integer) else y,
            np.asarray(np.arange(len(x)) if sample_indices is None else sample_indices, dtype=np.int64),
        )
    for arr in arrays:
        if isinstance(arr, _RowBytes):
            arr.update(h)
            continue
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class _RowBytes:
    """Inputs read a block of rows at a time, hashed as their whole float32 array would be."""

    def __init__(self, rows):
        self.rows = rows

    def update(self, h) -> None:
        dtype = np.dtype(str(self.rows.dtype).removeprefix("torch."))
        h.update(f"{dtype.str}{tuple(self.rows.shape)}".encode())
        step = max(1, (64 << 20) // (4 * int(np.prod(self.rows.shape[1:]))))
        for lo in range(0, len(self.rows), step):
            h.update(np.ascontiguousarray(self.rows[lo : lo + step].numpy()).tobytes())


def factor_cache_key(
    model: nn.Module,
    images: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | None,
    active_classes: np.ndarray | None,
    settings: InfluenceSettings,
    sample_indices: np.ndarray | None = None,
    checkpoint_sha256: str | None = None,
    task: Task | str | None = None,
    data_hash: str | None = None,
) -> dict:
    """The cache key of factors fitted with these arguments (a JSON-able dict).

    ``checkpoint_sha256`` (the checkpoint file's hash) replaces hashing the weights when given;
    ``data_hash`` (e.g. the data set's content hash plus the indices used) replaces hashing the data.
    A task other than classification over ``active_classes`` adds its :meth:`Task.key` as "task"
    (keys of classification factors are unchanged).
    """
    resolved = resolve_task(task, active_classes)
    key = {
        "checkpoint": checkpoint_sha256 or f"state_dict:{state_dict_sha256(model)}",
        "data": data_hash or data_sha256(images, labels, sample_indices),
        "layers": list(resolve_layers(model, settings)),
        "active_classes": None if active_classes is None else [int(c) for c in np.asarray(active_classes)],
        "settings": settings.factor_key(),
    }
    default = isinstance(resolved, ClassificationTask) and resolved.output.key() == "logits"
    if not default or active_classes is None:
        key["task"] = resolved.key()
    return key


def check_key(stored: dict, expected: dict, path: str | Path) -> None:
    """Raise FactorCacheError naming every field where ``stored`` differs from ``expected``."""
    stored, expected = json.loads(json.dumps(stored)), json.loads(json.dumps(expected))
    diffs = [k for k in sorted(set(stored) | set(expected)) if stored.get(k) != expected.get(k)]
    if diffs:
        detail = "; ".join(
            f"{k}: stored {_brief(stored.get(k))}, expected {_brief(expected.get(k))}" for k in diffs
        )
        raise FactorCacheError(
            f"{path}: factors were fitted for other inputs ({detail}). Delete the file to refit, or "
            "point to the factors of this checkpoint, data and settings."
        )


def _brief(value: object, n: int = 80) -> str:
    s = json.dumps(value)
    return s if len(s) <= n else s[: n - 3] + "..."


def save_factors(path: str | Path, factors: InfluenceFactors, include_covariances: bool = False) -> None:
    """Write ``factors`` to ``path`` atomically (format in the module doc).

    The covariances A and S are left out unless ``include_covariances``: scores need only their
    eigenpairs, and on ResNet-18 they would add ~0.7 GB per checkpoint. Keep them to debug a factor.
    """
    # Through a file object: given a path, torch.save names the archive after the random temporary
    # file, so the same factors would give different bytes.
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(factor_object(factors, include_covariances), f)


def factor_object(factors: InfluenceFactors, include_covariances: bool = False) -> dict:
    """What :func:`save_factors` writes with ``torch.save``: plain containers (the module doc)."""
    skip = () if include_covariances else ("activation_cov", "gradient_cov")
    layers = {}
    for name, lf in factors.layers.items():
        entry: dict[str, object] = {
            "meta": json.dumps(
                {
                    "kind": lf.kind,
                    "out_dim": lf.out_dim,
                    "in_dim": lf.in_dim,
                    "has_bias": lf.has_bias,
                    "n_samples": lf.n_samples,
                    "solver": lf.solver,
                    "min_raw": lf.min_raw,
                }
            )
        }
        for t in _TENSORS:
            value = getattr(lf, t)
            if value is not None and t not in skip:
                entry[t] = value.detach().cpu().to(torch.float64).contiguous()
        layers[name] = entry
    return {
        "format": FACTORS_FORMAT,
        "key": json.dumps(factors.key, sort_keys=True),
        "method": factors.method,
        "fisher": factors.fisher,
        "n_samples": int(factors.n_samples),
        "timings": json.dumps(factors.timings),
        "fit_settings": json.dumps(factors.fit_settings),
        "skipped": torch.as_tensor(np.asarray(factors.skipped, dtype=np.int64)),
        "underflow": torch.as_tensor(np.asarray(factors.underflow, dtype=np.int64)),
        "compute_dtype": factors.compute_dtype,
        "layers": layers,
    }


def load_factors(path: str | Path, expected_key: dict | None = None) -> InfluenceFactors:
    """Read factors written by :func:`save_factors`; with ``expected_key``, check it matches.

    Raises:
        FileNotFoundError: no such file (fit and save the factors).
        FactorCacheError: unreadable file, other format, or a key that differs (fields named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no factors file; fit the factors first")
    factors = factors_from_object(lambda: torch.load(path, map_location="cpu", weights_only=True), path)
    if expected_key is not None:
        check_key(factors.key, expected_key, path)
    return factors


def factors_from_object(read, where: str | Path) -> InfluenceFactors:
    """The :class:`InfluenceFactors` of what ``read()`` loads (:func:`factor_object`'s form); a
    FactorCacheError naming ``where`` where it cannot be read or is of another format."""
    try:
        obj = read()
        if obj.get("format") != FACTORS_FORMAT:
            raise ValueError(f"format {obj.get('format')!r}, expected {FACTORS_FORMAT!r}")
        key = json.loads(obj["key"])
        layers = {}
        for name, entry in obj["layers"].items():
            meta = json.loads(entry["meta"])
            lf = LayerFactors(
                name, meta["kind"], meta["out_dim"], meta["in_dim"], meta["has_bias"], meta["n_samples"]
            )
            lf.solver, lf.min_raw = meta["solver"], meta["min_raw"]
            for t in _TENSORS:
                if t in entry:
                    setattr(lf, t, entry[t])
            layers[name] = lf
        return InfluenceFactors(
            obj["method"],
            obj["fisher"],
            layers,
            obj["skipped"].numpy().astype(np.int64),
            int(obj["n_samples"]),
            key,
            json.loads(obj["timings"]),
            json.loads(obj["fit_settings"]),
            obj["underflow"].numpy().astype(np.int64) if "underflow" in obj else np.zeros(0, np.int64),
            str(obj.get("compute_dtype", "")),
        )
    except Exception as exc:
        raise FactorCacheError(
            f"{where}: not a readable epochlens factors file ({type(exc).__name__}: {str(exc)[:200]}). "
            "Delete it and fit the factors again."
        ) from exc


def load_or_fit_factors(
    path: str | Path,
    model: nn.Module,
    images: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | None,
    active_classes: np.ndarray | None,
    settings: InfluenceSettings,
    sample_indices: np.ndarray | None = None,
    checkpoint_sha256: str | None = None,
    task: Task | str | None = None,
    **fit_options,
) -> tuple[InfluenceFactors, bool]:
    """Factors from ``path`` if its key matches these inputs, else fitted and saved there.

    Returns:
        (factors, reused) with reused True when the file was loaded.
    """
    from epochlens.influence.factors import fit_factors

    key = factor_cache_key(
        model, images, labels, active_classes, settings, sample_indices, checkpoint_sha256, task
    )
    if Path(path).is_file():
        try:
            return load_factors(path, key), True
        except FactorCacheError:
            pass
    factors = fit_factors(
        model, images, labels, active_classes, settings, sample_indices, key=key, task=task, **fit_options
    )
    save_factors(path, factors)
    return factors, False


def save_table(path: str | Path, table: pd.DataFrame) -> None:
    """Write a table (diagnostics, detection) as CSV, atomically."""
    write_atomic(path, lambda p: table.to_csv(p, index=False))


def save_sums(path: str | Path, sums: CovarianceSums | CorrectionSums, key: dict) -> None:
    """Write one shard's sums (:class:`CovarianceSums` or :class:`CorrectionSums`) atomically, with
    ``key`` (the factors' cache key plus the shard: what they were computed from). A
    ``torch.save`` of plain containers (float64 tensors, int lists), loadable with weights_only."""
    if isinstance(sums, CovarianceSums):
        kind = "covariances"
        tensors = {"activation": sums.activation, "gradient": sums.gradient}
        extra = {"positions": json.dumps(sums.positions)}
    else:
        kind = "corrections"
        tensors = {"sums": sums.sums}
        extra = {}
    obj = {
        "format": SUMS_FORMAT,
        "kind": kind,
        "key": json.dumps(key, sort_keys=True),
        "n_valid": int(sums.n_valid),
        "n_seen": int(sums.n_seen),
        "skipped": torch.as_tensor(np.asarray(sums.skipped, dtype=np.int64)),
        "vanished": torch.as_tensor(np.asarray(sums.vanished, dtype=np.int64)),
        **{
            k: {n: t.detach().cpu().to(torch.float64).contiguous() for n, t in v.items()}
            for k, v in tensors.items()
        },
        **extra,
    }
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)


def load_sums(path: str | Path, expected_key: dict | None = None) -> CovarianceSums | CorrectionSums:
    """Read a shard's sums written by :func:`save_sums`; with ``expected_key``, check it matches.

    Raises:
        FileNotFoundError: no such file. FactorCacheError: unreadable, other format or other key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no shard file; compute the shard first")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        if obj.get("format") != SUMS_FORMAT:
            raise ValueError(f"format {obj.get('format')!r}, expected {SUMS_FORMAT!r}")
        key = json.loads(obj["key"])
        common = (
            int(obj["n_valid"]),
            int(obj["n_seen"]),
            obj["skipped"].numpy().astype(np.int64).tolist(),
            obj["vanished"].numpy().astype(np.int64).tolist(),
        )
        if obj["kind"] == "covariances":
            sums = CovarianceSums(
                dict(obj["activation"]), dict(obj["gradient"]), json.loads(obj["positions"]), *common
            )
        else:
            sums = CorrectionSums(dict(obj["sums"]), *common)
    except Exception as exc:
        raise FactorCacheError(
            f"{path}: not a readable epochlens shard file ({type(exc).__name__}: {str(exc)[:200]}). "
            "Delete it and compute the shard again."
        ) from exc
    if expected_key is not None:
        check_key(key, expected_key, path)
    return sums
