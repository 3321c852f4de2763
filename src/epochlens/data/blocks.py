"""Arrays a block of rows at a time: hashed (:func:`update_hash`), copied (:func:`copy_rows`), and
held on disk while ``prepare_data`` builds a large data set (:class:`Spill`, a scratch HDF5 file
beside ``dataset.h5`` for decoded images or a text run's tokens: a million CIFAR-sized images take
3 GB of disk, not of memory; named as :mod:`epochlens.atomic` names its temporaries, so that one
a killed job left is removed by the next write of ``dataset.h5``)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from epochlens.atomic import orphan_tag

#: Bytes of the rows hashed, buffered or copied at a time.
BLOCK_BYTES = 16 << 20


def update_hash(h, array, seen=None) -> None:
    """Feed ``array``'s dtype, shape and C-ordered bytes to the hash ``h``, a block of rows at a time:
    the digest of the whole array's bytes without a copy of the whole array (nor a read of one on
    disk); ``seen(block)`` is called with each block read."""
    if not hasattr(array, "shape") or not np.ndim(array):
        array = np.ascontiguousarray(array)
    h.update(f"{array.dtype.str}{array.shape}".encode())
    step = max(1, BLOCK_BYTES // max(1, array[:1].nbytes))
    for lo in range(0, len(array), step):
        block = np.ascontiguousarray(array[lo : lo + step])
        h.update(block.tobytes())
        if seen is not None:
            seen(block)


class Spill:
    """Scratch storage beside ``output`` for splits built before they are written; deleted on exit."""

    def __init__(self, output: str | Path):
        self.path = Path(output).with_name(f".{Path(output).name}.{orphan_tag()}spill.h5")
        self._file: h5py.File | None = None

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)

    def group(self, name: str) -> h5py.Group:
        """A group of the scratch file (e.g. a text run's token rows: epochlens.formats.token_store)."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = h5py.File(self.path, "w")
        return self._file.require_group(name)

    def rows(self, n: int, first: np.ndarray) -> SpilledRows:
        """Room for ``n`` rows shaped and typed like ``first``, written in order."""
        block, g = max(1, min(n, BLOCK_BYTES // max(1, first.nbytes))), self.group("images")
        array = g.create_dataset(
            f"split{len(g)}", (n, *first.shape), first.dtype, chunks=(block, *first.shape)
        )
        return SpilledRows(array, block)


class SpilledRows:
    """Rows of a scratch array set in order (``rows[i] = image``), a block buffered at a time;
    :meth:`finish` returns the array, read by rows as a NumPy array is (``array[lo:hi]``)."""

    def __init__(self, array: h5py.Dataset, block: int):
        self.array = array
        self._buffer = np.empty((block, *array.shape[1:]), array.dtype)
        self._start, self._filled = 0, 0

    def __setitem__(self, row: int, value: np.ndarray) -> None:
        if row != self._start + self._filled:
            raise IndexError(f"rows are spilled in order: row {row} after {self._start + self._filled - 1}")
        self._buffer[self._filled] = value
        self._filled += 1
        if self._filled == len(self._buffer):
            self._flush()

    def _flush(self) -> None:
        self.array[self._start : self._start + self._filled] = self._buffer[: self._filled]
        self._start, self._filled = self._start + self._filled, 0

    def finish(self) -> h5py.Dataset:
        self._flush()
        return self.array


def copy_rows(source, target: h5py.Dataset) -> None:
    """Copy ``source`` (any array read by rows) into ``target`` a block of whole chunks at a time."""
    chunk = (target.chunks or (1,))[0]
    row_bytes = max(1, source.dtype.itemsize * int(np.prod(source.shape[1:], dtype=np.int64)))
    step = max(chunk, BLOCK_BYTES // row_bytes // chunk * chunk)
    for lo in range(0, len(source), step):
        target[lo : lo + step] = source[lo : lo + step]
