"""A run's per-sample series read a range of samples at a time, never whole: the (m checkpoints,
N samples) arrays of ``sample_outputs.npz`` (:class:`NpzColumns`) and a curvature folder's
per-image arrays (:func:`npy_rows`). A dossier of a million samples and 21 checkpoints reads
65,536 samples' values at a time instead of 840 MB of float64 series at once."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np


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
            with zipfile.ZipFile(self.path) as archive, open(self.path, "rb") as f:
                for info in archive.infolist():
                    name = info.filename.removesuffix(".npy")
                    if info.compress_type == zipfile.ZIP_STORED:
                        self._stored[name] = _member_array(f, info.header_offset)
                    else:
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


def _member_array(f, header_offset: int) -> tuple[int, np.dtype, tuple[int, ...]]:
    """(offset of the data, dtype, shape) of the stored ``.npy`` member whose local header is at
    ``header_offset``; ValueError for what :meth:`NpzColumns.columns` cannot seek in."""
    f.seek(header_offset)
    local = f.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError("a damaged zip member header")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    f.seek(header_offset + 30 + name_length + extra_length)
    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = header(f)
    if fortran and len(shape) > 1 or dtype.hasobject or len(shape) > 2:
        raise ValueError(f"an array of shape {shape} ({dtype}, Fortran order {fortran}) is not a series")
    return f.tell(), dtype, shape


def npy_rows(path: str | Path, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of an ``.npy`` file (a memory map closed again: the file is not held)."""
    values = np.load(path, mmap_mode="r", allow_pickle=False)
    try:
        return np.array(values[lo:hi])
    finally:
        del values
