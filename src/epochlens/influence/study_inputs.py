"""What the influence jobs of one checkpoint share (factors, their shards and the scores): the
training samples the checkpoint was trained on, the run's task, and which of them a shard covers.

Images are read a batch at a time (:class:`epochlens.data.rows.NormalizedRows`) with their labels in
memory; a text run's samples are a torch Dataset of dicts
(``input_ids``, ``attention_mask``, ``labels``: what the engine reads from a Dataset, labels None).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import Dataset, StackDataset, Subset

from epochlens.data.rows import NormalizedRows
from epochlens.data.text import TextDataset
from epochlens.job import CheckpointJob
from epochlens.tasks import ClassificationTask, Task, task_from_config


def trained_samples(job: CheckpointJob) -> tuple[NormalizedRows | Dataset, np.ndarray | None, np.ndarray]:
    """The training samples outside the holdout (the ones a checkpoint is trained on): (x (N', C,
    H, W) normalised images read when indexed, y (N',) labels, positions (N',) in the training
    split); for a text run x is a Dataset of dicts holding the labels and y is None."""
    trained = np.flatnonzero(~job.data.holdout)
    if isinstance(job.data, TextDataset):
        return (
            with_labels(job.data.rows("train", trained), job.data.train_labels[trained])[0],
            None,
            trained,
        )
    return NormalizedRows(job.data, "train", trained), job.data.train_labels[trained], trained


def shard_samples(
    x: NormalizedRows | Dataset, y: np.ndarray | None, trained: np.ndarray, rows: np.ndarray
) -> tuple[NormalizedRows | Dataset, np.ndarray | None, np.ndarray]:
    """The samples ``rows`` (positions in ``trained``) of :func:`trained_samples`' output."""
    if y is None:
        return Subset(x, rows.tolist()), None, trained[rows]
    return x.select(rows), y[rows], trained[rows]


def with_labels(
    inputs: torch.Tensor | Mapping[str, torch.Tensor], labels: np.ndarray
) -> tuple[torch.Tensor | Dataset, np.ndarray | None]:
    """(data, labels) as the engine takes them: a tensor of images with its labels, or keyword
    inputs (a text model's) as a Dataset of dicts that hold the labels, with labels None."""
    if isinstance(inputs, Mapping):  # a text-to-text model's inputs hold its decoder labels already
        tensors = {"labels": torch.as_tensor(np.asarray(labels, np.int64)), **inputs}
        return StackDataset(**tensors), None
    return inputs, labels


def run_task(spec: str | Mapping | None, active: np.ndarray | None) -> tuple[Task, np.ndarray | None]:
    """The run's task (``runs.<run>.task``) at a checkpoint whose trained classes are ``active``,
    and the active classes to pass beside it (those of a classification task; None otherwise),
    so that classification keeps the cache keys it always had."""
    task = task_from_config(spec, active)
    return task, (active if isinstance(task, ClassificationTask) else None)


def shard_rows(n: int, shard: int, nshards: int) -> np.ndarray:
    """Positions [lo, hi) of shard ``shard`` (0-based) of ``nshards`` among ``n`` samples:
    contiguous, in order, sizes differing by at most one; the shards cover every position once."""
    if nshards < 1 or not 0 <= shard < nshards:
        raise ValueError(f"shard {shard} of {nshards}: need 0 <= shard < nshards")
    return np.arange(shard * n // nshards, (shard + 1) * n // nshards)
