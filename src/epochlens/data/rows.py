"""A ``dataset.h5`` of images read by rows, never whole: a job whose memory must stay flat as the
data set grows reads only the rows it computes on.

* :func:`open_dataset`: the run's :class:`~epochlens.data.Dataset`, images left in the file
  (:class:`RowReader`, read chunk by chunk), the content hash ``prepare_data`` stored: what every
  job but training works from (:func:`epochlens.data.text_rows.open_any_dataset`: a text run's
  too). A damaged chunk fails its zlib checksum when read (:class:`DataError` naming the file).
* :class:`NormalizedRows`: ``Dataset.normalized(split, indices)`` read a batch at a time, where a
  stage would hold the whole split (sample outputs, evaluation, curvature).
* :class:`StoredImages`: the arrays for a pass over every image (thumbnail sheets), the content
  hash checked in the same pass as the value range (:meth:`StoredImages.verify`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np

from epochlens.data.blocks import BLOCK_BYTES, update_hash  # a block: five thousand CIFAR images
from epochlens.data.dataset import Dataset
from epochlens.errors import DataError

if TYPE_CHECKING:
    import torch

#: HDF5's chunk cache per open array, which a pass fills (32 MB made memory grow with N by as much).
CHUNK_CACHE_BYTES = 8 << 20


class RowReader:
    """An array of a ``dataset.h5`` (N, ...) read by rows: ``reader[lo:hi]``, ``reader[i]``,
    ``reader[indices]`` (any int indices, in any order, repeated or not, or a boolean mask) and
    ``reader[rows, columns]`` read only the chunks that hold them; ``np.asarray(reader)`` whole."""

    def __init__(self, array: h5py.Dataset, path: Path):
        self.array, self.path = array, path
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim
        self._rows = (array.chunks or (max(1, BLOCK_BYTES // max(1, self.row_bytes)),))[0]

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self[:] if dtype is None else self[:].astype(dtype)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, tuple):  # rows, then within them, as numpy reads (rows, columns)
            one = isinstance(key[0], (int, np.integer))
            return self[key[0]][key[1:] if one else (slice(None), *key[1:])]
        try:
            if isinstance(key, slice):
                return self.array[key]
            if isinstance(key, (int, np.integer)):  # one row, as numpy gives it
                return self._take(np.array([key], dtype=np.int64))[0]
            key = np.asarray(key)  # int positions, or a boolean mask of the rows
            return self._take(np.flatnonzero(key) if key.dtype == bool else key.astype(np.int64).reshape(-1))
        except OSError as exc:  # a chunk that fails its checksum or cannot be decompressed
            raise DataError(
                f"{self.path}: {self.array.name} cannot be read ({exc}); the file is damaged. Delete "
                "it and rerun the prepare_data rule."
            ) from exc

    def _take(self, indices: np.ndarray) -> np.ndarray:
        """Rows ``indices`` (negative counted from the end), reading each chunk that holds any once."""
        n = len(self)
        if len(indices) and (indices.min() < -n or indices.max() >= n):
            raise IndexError(f"row indices out of range for {n} rows of {self.path}:{self.array.name}")
        indices = indices % max(n, 1)
        out = np.empty((len(indices), *self.shape[1:]), dtype=self.dtype)
        if len(indices) == 0:
            return out
        if indices[-1] - indices[0] + 1 == len(indices) and np.all(np.diff(indices) == 1):
            out[:] = self.array[int(indices[0]) : int(indices[-1]) + 1]
            return out
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        block = ordered // self._rows
        starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])
        for start, end in zip(starts, np.r_[starts[1:], len(ordered)], strict=True):
            lo = int(block[start]) * self._rows
            out[order[start:end]] = self.array[lo : lo + self._rows][ordered[start:end] - lo]
        return out


@dataclass
class StoredDataset(Dataset):
    """A :class:`~epochlens.data.Dataset` whose images stay in its ``dataset.h5``
    (:class:`RowReader`), with the content hash ``prepare_data`` computed and stored."""

    stored_hash: str = ""

    @property
    def content_hash(self) -> str:
        """The stored hash while the images are the file's (a copy with other images, e.g. a
        trigger stamped on them, is hashed again)."""
        if isinstance(self.train_images, RowReader) and isinstance(self.test_images, RowReader):
            return self.stored_hash
        return super().content_hash


def open_dataset(path: str | Path) -> StoredDataset:
    """A ``dataset.h5`` written by :func:`~epochlens.data.write_dataset`, its images read by rows
    when asked for (the file stays open while they are referenced); everything else in memory."""
    path = Path(path)
    try:
        f = h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
        train, test = f["train"], f["test"]
        attrs = f.attrs
        return StoredDataset(
            name=str(attrs["name"]),
            source=str(attrs["source"]),
            train_images=RowReader(train["images"], path),
            train_labels=train["labels"][()],
            test_images=RowReader(test["images"], path),
            test_labels=test["labels"][()],
            num_classes=int(attrs["num_classes"]),
            scale=float(attrs["scale"]),
            mean=tuple(float(v) for v in attrs["mean"]),
            std=tuple(float(v) for v in attrs["std"]),
            holdout=train["holdout"][()],
            class_names=json.loads(attrs["class_names"]),
            train_groups=train["groups"][()] if "groups" in train else None,
            test_groups=test["groups"][()] if "groups" in test else None,
            group_names=json.loads(attrs.get("group_names", "[]")),
            kind=str(attrs.get("kind", "classification")),
            ground_truth=train["ground_truth"][()] if "ground_truth" in train else None,
            stored_hash=str(attrs["content_hash"]),
        )
    except (OSError, KeyError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc


class NormalizedRows:
    """``data.normalized(split, indices)`` (all rows when ``indices`` is None) as a read-only
    float32 tensor (N, ...) that reads its rows when indexed: ``rows[a:b]``, ``rows[positions]``
    (an int array or tensor) read and normalise those rows only, equal to the same rows of the
    whole; ``rows.select(positions)`` picks rows without reading any."""

    def __init__(self, data: Dataset, split: str, indices: np.ndarray | None = None):
        import torch

        self.data, self.split = data, split
        n = len(data.labels(split))
        self.indices = np.arange(n, dtype=np.int64) if indices is None else np.asarray(indices, np.int64)
        images = data.train_images if split == "train" else data.test_images
        self.shape = (len(self.indices), *images.shape[1:])
        self.ndim, self.dtype = len(self.shape), torch.float32

    def __len__(self) -> int:
        return len(self.indices)

    def is_floating_point(self) -> bool:
        return True

    def select(self, positions) -> NormalizedRows:
        return NormalizedRows(self.data, self.split, self.indices[int_positions(positions)])

    def __getitem__(self, key) -> torch.Tensor:
        key = key if isinstance(key, slice) else int_positions(key)
        return self.data.normalized(self.split, self.indices[key])


def int_positions(key) -> np.ndarray:
    """Int positions from an int array, list or tensor (on any device)."""
    if hasattr(key, "detach"):
        key = key.detach().cpu().numpy()
    return np.asarray(key, dtype=np.int64)


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
        extremes = [np.inf, -np.inf]

        def seen(block: np.ndarray) -> None:  # the images' range, in the hash's pass
            if block.size:
                extremes[:] = min(extremes[0], float(block.min())), max(extremes[1], float(block.max()))

        try:
            for key in keys:
                update_hash(h, f[key], seen if key.endswith("/images") else None)
        except OSError as exc:
            raise self._incomplete(exc) from exc
        if groups:
            h.update(json.dumps(json.loads(f.attrs.get("group_names", "[]"))).encode())
        return h.hexdigest(), *extremes

    def _incomplete(self, exc: Exception) -> DataError:
        what = f"{self.path}: not a complete epochlens dataset.h5 ({exc})."
        return DataError(f"{what} Delete it and rerun the prepare_data rule.")
