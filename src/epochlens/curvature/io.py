"""Curvature results on disk: shard files and the merged per-epoch files of DESIGN.md.

One (run, index, epoch) is computed in S shards; shard k of S covers the contiguous range of
training-sample indices :func:`epochlens.shards.shard_range` gives. A shard is one ``.npz``
holding its range, the per-sample results of that range and a JSON header (estimator, device,
timing, input hashes). :func:`merge_shards` checks that the shards tile ``0..N`` and agree on
everything but timing, then writes, atomically, into the epoch folder:

    per_image_curvature.npy, per_image_directional_eig.npy,
    per_image_loss.npy, per_image_grad_norm.npy   float32 (N_train,), NaN for inactive classes
    per_image_labels.npy                           int64 (N_train,)
    per_image_correct.npy                          bool (N_train,), False for inactive classes
    per_image_holdout.npy                          bool (N_train,), the validation holdout
    metadata.json                                  epoch, allowed_classes, estimator, device,
                                                   compute_time_seconds, stats, provenance

This module does not import torch, so merging is cheap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from epochlens.atomic import save_npy, write_atomic, write_json
from epochlens.errors import EpochlensError
from epochlens.provenance import provenance

#: Per-sample float32 results, in the order of the merged file names.
FLOAT_KEYS = ("curvature", "directional_eig", "loss", "grad_norm")
#: Every per-sample array of a shard and its dtype.
ARRAY_DTYPES = {
    **dict.fromkeys(FLOAT_KEYS, np.float32),
    "correct": np.bool_,
    "labels": np.int64,
    "holdout": np.bool_,
}
#: Header fields every shard of one epoch must agree on.
_SHARED_HEADER = ("epoch", "allowed_classes", "estimator", "n_samples", "nshards", "inputs")


def merged_names() -> dict[str, str]:
    """{key: file name} of the merged per-sample arrays."""
    return {key: f"per_image_{key}.npy" for key in ARRAY_DTYPES}


def write_shard(path: str | Path, lo: int, hi: int, arrays: Mapping[str, np.ndarray], header: dict) -> None:
    """Write one shard atomically: ``arrays`` (each of length hi - lo, keys of ARRAY_DTYPES), header."""
    data = {}
    for key, dtype in ARRAY_DTYPES.items():
        a = np.asarray(arrays[key])
        if a.shape != (hi - lo,):
            raise ValueError(f"shard array {key} has shape {a.shape}, expected ({hi - lo},)")
        data[key] = a.astype(dtype, copy=False)
    header = {**header, "lo": int(lo), "hi": int(hi)}

    def _write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, header=np.array(json.dumps(header, sort_keys=True)), **data)

    write_atomic(path, _write)


def read_shard(path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a shard written by :func:`write_shard`."""
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            arrays = {key: z[key] for key in ARRAY_DTYPES}
    except (OSError, KeyError, ValueError) as exc:
        raise EpochlensError(
            f"{path}: not a complete curvature shard ({exc}). Delete it and rerun the workflow."
        ) from None
    return header, arrays


def curvature_stats(
    curvature: np.ndarray, correct: np.ndarray, active: np.ndarray, correct_name: str = "accuracy"
) -> dict:
    """Summary of one epoch: counts and curvature mean/median/std over active samples, and the share
    of them that are correct (``<correct_name>_active``; a regression's: ``learned_active``)."""
    c = curvature[active].astype(np.float64)
    some = len(c) > 0
    return {
        "n_samples": int(len(curvature)),
        "n_active": int(active.sum()),
        "n_inactive": int((~active).sum()),
        "curvature_mean": float(np.mean(c)) if some else None,
        "curvature_median": float(np.median(c)) if some else None,
        "curvature_std": float(np.std(c)) if some else None,
        f"{correct_name}_active": float(correct[active].mean()) if some else None,
    }


def merge_shards(shard_paths: Sequence[str | Path], outputs: Mapping[str, str | Path], config: dict) -> dict:
    """Merge the shards of one epoch into the files of ``outputs`` and return the metadata.

    Args:
        shard_paths: every shard of the epoch, in any order.
        outputs: {key: path} for every key of ARRAY_DTYPES plus ``metadata``.
        config: the settings the results depend on (hashed into the provenance).
    """
    shards = sorted((read_shard(p) + (str(p),) for p in shard_paths), key=lambda s: s[0]["lo"])
    if not shards:
        raise EpochlensError("no curvature shards to merge")
    first, _, first_path = shards[0]
    n = first["n_samples"]
    expected_lo = 0
    for header, _, path in shards:
        for key in _SHARED_HEADER:
            if header[key] != first[key]:
                raise EpochlensError(
                    f"{path}: {key} differs from {first_path}; the shards come from different "
                    "runs or settings. Delete the epoch's shards folder and rerun."
                )
        if header["lo"] != expected_lo:
            raise EpochlensError(
                f"{path}: covers samples {header['lo']}..{header['hi']}, expected to start at "
                f"{expected_lo}; a shard is missing or from another shard count. Delete the "
                "epoch's shards folder and rerun."
            )
        expected_lo = header["hi"]
    if expected_lo != n or len(shards) != first["nshards"]:
        raise EpochlensError(
            f"{first_path}: the {len(shards)} shards cover samples 0..{expected_lo} of {n}; "
            "delete the epoch's shards folder and rerun."
        )

    merged = {
        key: np.concatenate([arrays[key] for _, arrays, _ in shards]).astype(dtype, copy=False)
        for key, dtype in ARRAY_DTYPES.items()
    }
    for key in ARRAY_DTYPES:
        save_npy(outputs[key], merged[key])
    active = np.isin(merged["labels"], np.asarray(first["allowed_classes"], dtype=np.int64))
    devices = sorted({h["device"] for h, _, _ in shards})
    regression = first.get("regression")  # a regression's loss and learned threshold
    metadata = {
        "epoch": first["epoch"],
        "allowed_classes": first["allowed_classes"],
        "estimator": first["estimator"],
        **({"regression": regression} if regression else {}),
        "device": devices[0] if len(devices) == 1 else devices,
        "shards": first["nshards"],
        "compute_time_seconds": float(sum(h["compute_time_seconds"] for h, _, _ in shards)),
        "stats": curvature_stats(
            merged["curvature"], merged["correct"], active, "learned" if regression else "accuracy"
        ),
        "provenance": provenance(config, first["inputs"]),
    }
    write_json(outputs["metadata"], metadata)
    return metadata


def read_epoch(folder: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, {key: array}) of one merged epoch folder written by :func:`merge_shards`."""
    folder = Path(folder)
    try:
        metadata = json.loads((folder / "metadata.json").read_text())
        arrays = {key: np.load(folder / name, allow_pickle=False) for key, name in merged_names().items()}
    except (OSError, ValueError) as exc:
        raise EpochlensError(
            f"{folder}: incomplete curvature results ({exc}). Rerun the workflow to rebuild it."
        ) from None
    lengths = {key: a.shape for key, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise EpochlensError(f"{folder}: per-image arrays differ in shape {lengths}; rerun this epoch.")
    return metadata, arrays
