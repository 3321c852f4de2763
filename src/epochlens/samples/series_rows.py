"""A run's per-sample series read a range of samples at a time, never whole: the (m checkpoints,
N samples) arrays of ``sample_outputs.npz`` (:class:`NpzColumns`, :func:`series_file`) and the
curvature folders' per-image arrays (:func:`npy_rows`, :func:`load_curvature`). A dossier of a
million samples and 21 checkpoints reads 65,536 samples' values at a time instead of 840 MB of
float64 series at once."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from epochlens.data.stored_npz import stored_members
from epochlens.errors import DataError


class NpzColumns:
    """The arrays of an ``.npz`` as ``np.savez`` writes it (members stored, not compressed):
    :meth:`columns` reads ``array[..., lo:hi]`` of a 2-D array by seeking to each of its rows;
    :meth:`whole` reads an array whole. A compressed member is read whole (and kept) when first
    asked for. Raises what ``np.load`` raises on a file that is not an ``.npz`` (OSError,
    ValueError, zipfile.BadZipFile: a ValueError)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._stored: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        self._loaded: dict[str, np.ndarray] = {}
        try:
            self._stored = {k: m for k, m in stored_members(self.path).items() if len(m[2]) <= 2}
            with zipfile.ZipFile(self.path) as archive:
                for info in archive.infolist():
                    if (name := info.filename.removesuffix(".npy")) not in self._stored:
                        self._loaded[name] = np.load(archive.open(info), allow_pickle=False)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"not an npz archive ({exc})") from exc

    @property
    def files(self) -> list[str]:
        return [*self._stored, *self._loaded]

    def shape(self, key: str) -> tuple[int, ...]:
        return self._stored[key][2] if key in self._stored else self._loaded[key].shape

    def whole(self, key: str) -> np.ndarray:
        return self.columns(key, 0, self.shape(key)[-1]) if key in self._stored else self._loaded[key]

    def row(self, key: str, r: int) -> np.ndarray:
        """Row ``r`` of a 2-D array (-1: the last), the other rows not read."""
        if key not in self._stored:
            return self._loaded[key][r]
        offset, dtype, (m, n) = self._stored[key]
        out = np.empty(n, dtype)
        with open(self.path, "rb") as f:
            f.seek(offset + (r % m) * n * dtype.itemsize)
            f.readinto(memoryview(out).cast("B"))
        return out

    def columns(self, key: str, lo: int, hi: int) -> np.ndarray:
        """``array[..., lo:hi]`` of a 1-D or 2-D array (a 2-D one: every row's columns lo:hi)."""
        if key not in self._stored:
            return self._loaded[key][..., lo:hi]
        offset, dtype, shape = self._stored[key]
        n = shape[-1]
        lo, hi = max(0, min(lo, n)), max(0, min(hi, n))
        rows = shape[0] if len(shape) == 2 else 1
        out = np.empty((rows, max(0, hi - lo)), dtype)
        with open(self.path, "rb") as f:
            for row in range(rows):
                f.seek(offset + (row * n + lo) * dtype.itemsize)
                f.readinto(memoryview(out[row]).cast("B"))
        return out if len(shape) == 2 else out[0]


def npy_rows(path: str | Path, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of an ``.npy`` file (a memory map closed again: the file is not held)."""
    values = np.load(path, mmap_mode="r", allow_pickle=False)
    try:
        return np.array(values[lo:hi])
    finally:
        del values


#: The curvature stage's per-sample arrays the dossier shows as series.
CURVATURE_SERIES = ("curvature", "grad_norm")


def series_file(path: str | Path, epochs: Sequence[int]) -> NpzColumns:
    """An index's ``sample_outputs.npz``, read by samples; DataError when it is unreadable or of
    other checkpoints than the run's ``epochs``."""
    try:
        npz = NpzColumns(path)
        stored = npz.whole("epochs").tolist()
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(
            f"{path}: not a readable sample_outputs file ({exc}). Rerun its sample_outputs job."
        ) from exc
    if stored != [int(e) for e in epochs]:
        raise DataError(
            f"{path}: outputs of checkpoints {stored}, the run analyses {list(epochs)}. "
            "Rerun its sample_outputs job."
        )
    return npz


def series_keys(npz: NpzColumns, prefix: str) -> list[str]:
    """The series ``{prefix}_{key}`` of an outputs file (a triggered split's apart)."""
    names = [k for k in npz.files if k.startswith(prefix)]
    return [k for k in names if not k.removeprefix(prefix).startswith("trigger_")]


def load_curvature(folders: Sequence[str | Path | None], n: int, lo: int = 0, hi: int | None = None) -> dict:
    """curvature and grad_norm (m, hi - lo) of samples lo:hi from each checkpoint's curvature
    folder (None: NaN, not computed there); {} without any."""
    if not any(folders):
        return {}
    hi = n if hi is None else min(n, hi)
    out = {key: np.full((len(folders), hi - lo), np.nan, np.float32) for key in CURVATURE_SERIES}
    for row, folder in enumerate(folders):
        for key in CURVATURE_SERIES if folder is not None else ():
            path = Path(folder) / f"per_image_{key}.npy"
            if (stored := np.load(path, mmap_mode="r", allow_pickle=False).shape[0]) != n:
                raise DataError(
                    f"{folder}: per_image_{key}.npy holds {stored} samples, the data set {n}: "
                    "the curvature is of other data. Rerun the run's curvature."
                )
            out[key][row] = npy_rows(path, lo, hi)
    return out
