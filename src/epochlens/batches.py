"""Batches of samples, read the same way by every stage: in-memory arrays, torch Datasets and DataLoaders.

A batch is a tensor or a nested container of tensors: a tuple/list ``(inputs, targets, ...)``, a dict
(Hugging Face style ``{"input_ids": ..., "attention_mask": ..., "labels": ...}``, or any Mapping such
as a ``BatchEncoding``), or combinations such as ``({"input_ids": ..., "attention_mask": ...}, labels)``.
Every tensor's first dimension is the sample. How a batch splits into model inputs and targets is the
task's business (:meth:`epochlens.tasks.Task.split_batch`).

:func:`to_device` moves a batch to a device and casts only its floating tensors to the compute dtype:
token ids, labels and masks (integer or bool tensors) are never cast, so ids reach an ``nn.Embedding``
as ids. :class:`SampleSource` gives ``(positions, global indices, batch)`` for in-memory arrays (sliced
directly, no per-item collation) and for Datasets/DataLoaders (read in order).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, SequentialSampler

from epochlens.errors import DataError

Batch = Any  # torch.Tensor | tuple | list | Mapping of these (nested)


def to_device(batch: Batch, device: torch.device | str | None, dtype: torch.dtype | None = None) -> Batch:
    """``batch`` with every tensor on ``device`` and every floating tensor in ``dtype`` (None: kept).

    Integer and bool tensors are moved but never cast. NumPy arrays become tensors (floating arrays
    are cast like floating tensors). Tuples, lists and Mappings keep their structure (a Mapping
    becomes a plain dict); anything else (strings, None, numbers) is returned unchanged.
    """
    if isinstance(batch, np.ndarray) and batch.dtype != object:
        batch = torch.as_tensor(batch)
    if isinstance(batch, torch.Tensor):
        target = dtype if (dtype is not None and batch.is_floating_point()) else batch.dtype
        return batch.to(device=device, dtype=target)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, dtype) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, dtype) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device, dtype) for v in batch)
    return batch


def tensors(batch: Batch) -> Iterator[torch.Tensor]:
    """Every tensor in a nested batch, depth first."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for v in batch.values():
            yield from tensors(v)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            yield from tensors(v)


def num_samples(batch: Batch) -> int:
    """Samples in ``batch``: the first dimension of its first tensor.

    Raises:
        DataError: the batch holds no tensor, or tensors whose first dimensions differ.
    """
    sizes = {int(t.shape[0]) for t in tensors(batch) if t.ndim > 0}
    if len(sizes) != 1:
        what = "no tensor" if not sizes else f"tensors with first dimensions {sorted(sizes)}"
        raise DataError(
            f"a batch of type {type(batch).__name__} holds {what}; every tensor of a batch must have "
            "the samples along its first dimension. Fix the dataset's __getitem__ or the collate_fn."
        )
    return sizes.pop()


def select_rows(batch: Batch, rows: torch.Tensor) -> Batch:
    """The samples ``rows`` (bool mask or index tensor) of every tensor in ``batch``."""
    if isinstance(batch, torch.Tensor):
        return batch[rows.to(batch.device)] if batch.ndim > 0 else batch
    if isinstance(batch, Mapping):
        return {k: select_rows(v, rows) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(select_rows(v, rows) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(select_rows(v, rows) for v in batch)
    return batch


def reads_rows(data: object) -> bool:
    """True for inputs that read their rows when indexed (``x[rows]`` gives a tensor; ``shape``,
    ``select``: :class:`epochlens.data.rows.NormalizedRows`), kept as they are instead of read whole."""
    return hasattr(data, "select") and hasattr(data, "shape")


def is_dataset(data: object) -> bool:
    """True for a torch Dataset or DataLoader (as opposed to an in-memory array)."""
    return isinstance(data, (Dataset, DataLoader))


@dataclass
class SampleSource:
    """Where a stage reads its samples from, in a fixed order.

    Either in-memory ``inputs`` (N, ...) with ``targets`` (N, ...) or None, sliced per batch as
    ``(inputs[rows], targets[rows])`` (or the inputs alone without targets); or a ``dataset``
    (a Dataset read through a sequential DataLoader, or a DataLoader used as is).

    Attributes:
        indices: (N,) int64 global index of each position (reports and per-sample random draws).
        rows: positions to read (None: all); only for in-memory sources.
    """

    inputs: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    dataset: Dataset | DataLoader | None = None
    indices: np.ndarray | None = None
    rows: np.ndarray | None = None
    what: str = "data"

    def __len__(self) -> int:
        if self.inputs is not None:
            return len(self.inputs)
        ds = self.dataset.dataset if isinstance(self.dataset, DataLoader) else self.dataset
        try:
            return len(ds)  # type: ignore[arg-type]
        except TypeError:
            raise DataError(f"{self.what}: the dataset has no length; give a map-style Dataset") from None

    @property
    def in_memory(self) -> bool:
        return self.inputs is not None

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, Batch]]:
        """(positions (B,) int64, batch) in order; the batch is on the CPU as read."""
        if self.inputs is not None:
            rows = np.arange(len(self.inputs)) if self.rows is None else self.rows
            for start in range(0, len(rows), batch_size):
                sel = rows[start : start + batch_size]
                idx = torch.as_tensor(sel)
                x = self.inputs[idx]
                yield sel, (x if self.targets is None else (x, self.targets[idx]))
            return
        loader = self.dataset
        if not isinstance(loader, DataLoader):
            loader = DataLoader(loader, batch_size=batch_size, shuffle=False)
        elif not isinstance(loader.sampler, SequentialSampler) and not isinstance(
            loader.dataset, IterableDataset
        ):
            raise DataError(
                f"{self.what}: the DataLoader's sampler is {type(loader.sampler).__name__}; per-sample "
                "results are written by position, so the samples must come in dataset order. Use "
                "shuffle=False (a SequentialSampler), or pass the Dataset itself."
            )
        start = 0
        for batch in loader:
            n = num_samples(batch)
            yield np.arange(start, start + n, dtype=np.int64), batch
            start += n
        if self.indices is not None and start != len(self.indices):
            raise DataError(
                f"{self.what}: the data gave {start} samples but {len(self.indices)} sample indices were "
                "given; pass one index per sample (or none)."
            )


def sample_source(
    data: torch.Tensor | np.ndarray | Dataset | DataLoader,
    targets: torch.Tensor | np.ndarray | None = None,
    sample_indices: np.ndarray | None = None,
    what: str = "data",
) -> SampleSource:
    """A :class:`SampleSource` for in-memory ``data`` (N, ...) with ``targets`` (N, ...), or a dataset.

    Raises:
        DataError: targets given with a dataset (they belong in its items), lengths that differ,
            or an IterableDataset (no positions to write results to).
    """
    if is_dataset(data):
        if targets is not None:
            raise DataError(
                f"{what}: labels were given beside a Dataset/DataLoader; a dataset's items carry their "
                "own targets (e.g. (inputs, label) tuples or a dict with 'labels'). Pass labels=None."
            )
        ds = data.dataset if isinstance(data, DataLoader) else data
        if isinstance(ds, IterableDataset):
            raise DataError(f"{what}: an IterableDataset has no positions; give a map-style Dataset")
        source = SampleSource(dataset=data, what=what)
        n = len(source)
    else:
        if isinstance(data, (Mapping, tuple, list)):
            raise DataError(
                f"{what}: in-memory inputs must be one array (N, ...); for dict or tuple inputs give a "
                "Dataset whose items are (inputs, target) or a dict (e.g. torch.utils.data.TensorDataset)."
            )
        x = data if reads_rows(data) else torch.as_tensor(data)
        if x.ndim < 1:
            raise DataError(f"{what}: inputs must have the samples along the first dimension")
        y = None if targets is None else torch.as_tensor(targets)
        if y is not None and len(y) != len(x):
            raise DataError(f"{what}: inputs {tuple(x.shape)} and targets {tuple(y.shape)} differ in length")
        source = SampleSource(inputs=x, targets=y, what=what)
        n = len(x)
    if sample_indices is None:
        source.indices = np.arange(n, dtype=np.int64)
    else:
        source.indices = np.asarray(sample_indices, dtype=np.int64)
        if source.indices.shape != (n,):
            raise DataError(
                f"{what}: {len(source.indices)} sample indices for {n} samples; pass one per sample."
            )
    return source
