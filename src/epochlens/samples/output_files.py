"""The sample outputs on disk: a shard job's checkpoints stacked (``stack_outputs``), and the
shards of an index merged into ``index-{i}/sample_outputs.npz`` (:func:`merge_outputs`), torch-free.

A shard's file holds, besides every series (m, rows of the shard), each split's ``[lo, hi, n]``
as ``{split}_rows``; the merge checks that the shards tile every split and agree on the
checkpoints and series, then writes the series (m, N) one at a time, without the row keys.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from epochlens.atomic import write_atomic
from epochlens.errors import DataError

#: Each split's ``[lo, hi, n]`` in a shard's file.
ROW_KEYS = {"train": "train_rows", "test": "test_rows"}


def stack_outputs(per_epoch: Iterable[Mapping[str, np.ndarray]], m: int) -> dict[str, np.ndarray]:
    """``m`` checkpoints' outputs (:func:`~epochlens.samples.outputs.checkpoint_outputs`, in epoch
    order) as one file's arrays, each row filled as it comes (the series held once; one
    checkpoint's are its own arrays): ``epochs`` (m,), every series (m, rows), the row keys."""
    epochs, arrays, rows = np.zeros(m, np.int64), None, {}
    for row, outputs in enumerate(per_epoch):
        rows = rows or {k: np.asarray(outputs[k]) for k in ROW_KEYS.values() if k in outputs}
        series = {k: np.asarray(v) for k, v in outputs.items() if k != "epoch" and k not in rows}
        empty = (lambda v: v[None]) if m == 1 else (lambda v: np.empty((m, *v.shape), v.dtype))
        arrays, epochs[row] = arrays or {k: empty(v) for k, v in series.items()}, int(outputs["epoch"])
        for key, values in series.items():
            arrays[key][row] = values
        del outputs, series  # the next checkpoint's series computed without this one's
    return {"epochs": epochs, **rows, **(arrays or {})}


def write_outputs(path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write outputs (:func:`stack_outputs`) atomically as an ``.npz``, an array at a time."""
    _write_members(path, arrays.keys(), arrays.__getitem__)


def merge_outputs(shards: Sequence[str | Path], path: str | Path) -> None:
    """Merge one index's shard files (in shard order) into ``path``: every series concatenated
    along its samples, one series in memory at a time."""
    with ExitStack() as stack:
        files = [stack.enter_context(np.load(p)) for p in shards]
        _check_shards([str(p) for p in shards], files)
        keys = [k for k in files[0].files if k not in ROW_KEYS.values()]

        def merged(key: str) -> np.ndarray:
            parts = [f[key] for f in files]
            return parts[0] if key == "epochs" else np.concatenate(parts, axis=-1)

        _write_members(path, keys, merged)


def _check_shards(paths: list[str], files: list) -> None:
    """The shards agree on checkpoints and series, and each split's rows follow on from shard to
    shard over every sample; else a :class:`DataError` naming the file."""
    fix = "shards of another run or shard count: delete the index's sample_outputs folder and rerun"
    first = files[0]
    for path, f in zip(paths, files, strict=True):
        if set(f.files) != set(first.files) or not np.array_equal(f["epochs"], first["epochs"]):
            raise DataError(f"{path}: its checkpoints or series differ from those of {paths[0]}: {fix}")
    for split, key in ROW_KEYS.items():
        end = 0
        for path, f in zip(paths, files, strict=True):
            lo, hi, n = (int(v) for v in f[key])
            if lo != end:
                raise DataError(f"{path}: {split} samples from {lo}, the shards before end at {end}: {fix}")
            end = hi
        if end != n:
            raise DataError(f"{paths[-1]}: the shards' {split} samples end at {end} of {n}: {fix}")


def _write_members(path, keys: Iterable[str], value) -> None:
    """An ``.npz`` as ``np.savez`` writes it (stored, ZIP64), ``value(key)`` read as it is written."""

    def write(tmp):
        with zipfile.ZipFile(tmp, "w", allowZip64=True) as npz:
            for key in keys:
                with npz.open(f"{key}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(value(key)), allow_pickle=False)

    write_atomic(path, write)
