"""The arrays of an ``.npz`` that ``np.savez`` stored (not compressed), read by rows where they lie
in the file instead of whole: :func:`stored_members` finds each member's data (offset, dtype,
shape) from its zip and ``.npy`` headers; :class:`StoredRows` reads rows of one, a block at a
time (``prepare_data`` of a large ``.npz``: hashed, normalised and written to ``dataset.h5``
without the images in memory; the dossier's series: :mod:`epochlens.samples.series_rows`)."""

from __future__ import annotations

import math
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from epochlens.data.blocks import BLOCK_BYTES

Member = tuple[int, np.dtype, tuple[int, ...]]
Block = Callable[[np.ndarray], np.ndarray]


def stored_members(path: str | Path) -> dict[str, Member]:
    """``{name: (offset of its data, dtype, shape)}`` of each stored member of the ``.npz`` at
    ``path`` laid out in C order (compressed, Fortran-ordered and object members left out).
    Raises ``zipfile.BadZipFile`` or OSError for a file that is not a readable zip."""
    members = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        for info in archive.infolist():
            if info.compress_type == zipfile.ZIP_STORED:
                try:
                    members[info.filename.removesuffix(".npy")] = _member(f, info.header_offset)
                except ValueError:  # not an array we can read by rows: read as np.load reads it
                    continue
    return members


def _member(f, header_offset: int) -> Member:
    """(offset of the data, dtype, shape) of the stored ``.npy`` member whose local zip header is at
    ``header_offset``; ValueError for a damaged header or an array not stored in C order."""
    f.seek(header_offset)
    local = f.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError("a damaged zip member header")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    f.seek(header_offset + 30 + name_length + extra_length)
    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = header(f)
    if (fortran and len(shape) > 1) or dtype.hasobject or not shape:
        raise ValueError(f"an array of shape {shape} ({dtype}, Fortran order {fortran})")
    return f.tell(), dtype, tuple(shape)


class StoredRows:
    """An (N, ...) array of a stored ``.npz`` member, read by rows: ``rows[lo:hi]`` and ``rows[i]``
    read those rows (a NumPy array), ``np.asarray(rows)`` the whole; ``mapped(f)`` the same rows
    with ``f`` applied to each block read (a layout's transposition)."""

    def __init__(self, path: str | Path, member: Member, block: Block | None = None):
        self.path, self.member, self._block = Path(path), member, block or (lambda rows: rows)
        offset, dtype, shape = member
        self.dtype = dtype
        self.shape = (shape[0], *self._block(np.empty((0, *shape[1:]), dtype)).shape[1:])
        self.ndim, self.size = len(self.shape), math.prod(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def mapped(self, block: Block) -> StoredRows:
        return StoredRows(self.path, self.member, lambda rows: block(self._block(rows)))

    def rows(self, lo: int, hi: int) -> np.ndarray:
        offset, dtype, shape = self.member
        lo, hi = max(0, min(lo, shape[0])), max(0, min(hi, shape[0]))
        out = np.empty((max(0, hi - lo), *shape[1:]), dtype)
        with open(self.path, "rb") as f:
            f.seek(offset + lo * dtype.itemsize * math.prod(shape[1:]))
            f.readinto(memoryview(out.reshape(-1)).cast("B"))
        return self._block(out)

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1):
            lo, hi, _ = key.indices(len(self))
            return self.rows(lo, max(lo, hi))
        if isinstance(key, int | np.integer):
            i = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"row {key} of {len(self)}")
            return self.rows(i, i + 1)[0]
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self.rows(0, len(self))
        return whole if dtype is None else whole.astype(dtype)


def each_block(x: np.ndarray | StoredRows, block: Block) -> np.ndarray | StoredRows:
    """``block(x)``; of an array read by rows, the rows with ``block`` applied as they are read."""
    return x.mapped(block) if isinstance(x, StoredRows) else block(x)


def nonfinite_rows(x) -> np.ndarray:
    """The rows of ``x`` (N, ...) holding NaN or Inf, a block of rows at a time."""
    step = max(1, BLOCK_BYTES // max(1, x[:1].nbytes))
    bad = [lo + np.flatnonzero(~np.isfinite(x[lo : lo + step].reshape(-1, math.prod(x.shape[1:]))).all(1))
           for lo in range(0, len(x), step)]  # fmt: skip
    return np.concatenate(bad) if bad else np.zeros(0, np.int64)
