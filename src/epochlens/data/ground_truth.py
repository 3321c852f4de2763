"""Your own ground truth of which training samples are poisoned or corrupted (``data.ground_truth``),
for runs whose corruption happened before epochlens saw the data (a poisoning script run before
training, labels flipped by hand): a boolean data column, or a file of training positions.

* :func:`as_flags`: a column's values as a (N_train,) bool mask, refusing anything not boolean;
* :func:`read_positions_file`: ``.npy`` (integers) or text (one integer per line, ``#`` comments)
  of positions in the training split as the data is read (before the holdout), checked in range.

Torch-free: the workflow checks a positions file while it plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from epochlens.errors import DataError


def as_flags(values: Sequence[Any] | np.ndarray, column: str, origin: str) -> np.ndarray:
    """(N,) bool from a column of booleans; DataError naming the column, its values and the fix
    for anything else (integers 0/1 included: say what a sample is, as a boolean)."""
    array = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    if array.dtype == bool:
        return array.astype(bool)
    if array.dtype == object and all(isinstance(v, (bool, np.bool_)) for v in array):
        return array.astype(bool)
    kinds = sorted({type(v).__name__ for v in np.asarray(array, dtype=object).ravel()[:1000]})
    held = array.dtype if array.dtype != object else kinds
    raise DataError(
        f"{origin}: the ground-truth column {column!r} holds {held}, "
        "not booleans. Store True for each poisoned (corrupted) training sample and False for the "
        "others, or give their positions in a file (data.ground_truth.indices)."
    )


def read_positions_file(path: str | Path, n_train: int | None = None) -> np.ndarray:
    """Sorted unique int64 positions in the training split from ``path`` (``.npy`` of integers, or a
    text file with one integer per line); DataError naming the file for a missing file, values that
    are not integers, and (with ``n_train``) positions outside 0 .. n_train - 1."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"{path}: no such file (data.ground_truth.indices). Give the positions of the poisoned "
            "training samples as an .npy of integers or a text file with one per line."
        )
    try:
        if path.suffix == ".npy":
            values = np.load(path, allow_pickle=False)
        else:
            lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
            values = np.array([float(v) for v in lines if v]) if any(lines) else np.zeros(0)
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: not a readable list of positions ({exc}).") from exc
    values = np.asarray(values).ravel()
    if values.dtype == bool:
        raise DataError(
            f"{path}: a boolean array; data.ground_truth.indices takes positions (np.flatnonzero(mask)), "
            "a boolean data column goes in data.ground_truth.column."
        )
    if values.size and (not np.issubdtype(values.dtype, np.number) or not np.all(np.mod(values, 1) == 0)):
        raise DataError(f"{path}: positions must be integers, got {values[:5].tolist()}...")
    positions = np.unique(values.astype(np.int64))
    if positions.size and (positions[0] < 0 or (n_train is not None and positions[-1] >= n_train)):
        bad = positions[(positions < 0) | (positions >= (n_train if n_train is not None else np.inf))]
        raise DataError(
            f"{path}: positions {bad[:10].tolist()} are outside the training split"
            + (f" (0 .. {n_train - 1})" if n_train is not None else "")
            + ": positions count the training samples in the order the data is read, from 0."
        )
    return positions


def mark_positions(dataset: Any, path: str | Path) -> None:
    """Set ``dataset.ground_truth`` (a Dataset or TextDataset) from a positions file."""
    n = len(dataset.train_labels)
    dataset.ground_truth = np.isin(np.arange(n), read_positions_file(path, n))
