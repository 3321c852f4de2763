"""A run's per-sample series read a range of samples at a time, never whole: the (m checkpoints,
N samples) arrays of ``sample_outputs.npz`` (:class:`NpzColumns`) and a curvature folder's
per-image arrays (:func:`npy_rows`). A dossier of a million samples and 21 checkpoints reads
65,536 samples' values at a time instead of 840 MB of float64 series at once."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from epochlens.data.stored_npz import stored_members


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
