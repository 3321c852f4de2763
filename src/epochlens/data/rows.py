"""A ``dataset.h5`` of images read by rows, never whole: a job whose memory must stay flat as the
data set grows (a thumbnail sheet per thousand images of 50,000) opens :class:`StoredImages`,
whose arrays are h5py datasets that read only the rows sliced from them, and checks the file's
content hash by streaming it (:meth:`StoredImages.verify`: the hash :func:`read_dataset` checks,
block by block, in the same pass as the images' value range).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from epochlens.errors import DataError

#: Bytes of one block read at a time (five thousand CIFAR images).
BLOCK_BYTES = 16 << 20


class StoredImages:
    """The images, labels and attributes of a ``dataset.h5``, opened for reading by rows (a context
    manager). ``train_images`` and ``test_images`` are h5py datasets: ``[lo:hi]`` reads those rows."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._file = h5py.File(self.path, "r")
            f = self._file
            self.train_images, self.test_images = f["train/images"], f["test/images"]
            self.scale = float(f.attrs["scale"])
            self._stored_hash = str(f.attrs["content_hash"])
        except (OSError, KeyError) as exc:
            raise self._incomplete(exc) from exc

    def __enter__(self) -> StoredImages:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def blocks(self, key: str) -> Iterator[np.ndarray]:
        """The rows of the array ``key`` (e.g. ``train/images``) in consecutive blocks of at most
        :data:`BLOCK_BYTES` (or one row)."""
        array = self._file[key]
        row_bytes = max(1, array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
        step = max(1, BLOCK_BYTES // row_bytes)
        try:
            for lo in range(0, len(array), step):
                yield array[lo : lo + step]
        except OSError as exc:
            raise self._incomplete(exc) from exc

    def content_hash(self) -> str:
        """SHA-256 of images, labels (and groups) of both splits, read block by block: equal to
        :attr:`epochlens.data.dataset.Dataset.content_hash` of the whole data set."""
        return self._scan()[0]

    def verify(self) -> tuple[float, float]:
        """Check the content against the hash ``prepare_data`` stored (:class:`DataError` when it
        differs); return the smallest and largest stored image value times the scale, read in the
        same pass (float64: the scaled extremes are the extremes of the scaled values)."""
        digest, low, high = self._scan()
        if digest != self._stored_hash:
            raise DataError(f"{self.path}: content hash mismatch; the file is corrupt. Delete and rerun.")
        return tuple(sorted((low * self.scale, high * self.scale)))

    def _scan(self) -> tuple[str, float, float]:
        """One pass over the hashed arrays: the content hash, the images' smallest and largest value."""
        f, h = self._file, hashlib.sha256()
        keys = ["train/images", "train/labels", "test/images", "test/labels"]
        groups = "groups" in f["train"]
        keys += ["train/groups", "test/groups"] if groups else []
        low, high = np.inf, -np.inf
        for key in keys:
            h.update(f"{f[key].dtype.str}{f[key].shape}".encode())
            for block in self.blocks(key):
                h.update(np.ascontiguousarray(block).tobytes())
                if key.endswith("/images") and block.size:
                    low, high = min(low, float(block.min())), max(high, float(block.max()))
        if groups:
            h.update(json.dumps(json.loads(f.attrs.get("group_names", "[]"))).encode())
        return h.hexdigest(), low, high

    def _incomplete(self, exc: Exception) -> DataError:
        what = f"{self.path}: not a complete epochlens dataset.h5 ({exc})."
        return DataError(f"{what} Delete it and rerun the prepare_data rule.")
