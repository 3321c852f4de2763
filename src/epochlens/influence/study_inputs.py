"""What the influence jobs of one checkpoint share (factors, their shards and the scores): the
training images the checkpoint was trained on, the run's task, and which of them a shard covers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from epochlens.job import CheckpointJob
from epochlens.tasks import ClassificationTask, Task, task_from_config


def trained_samples(job: CheckpointJob) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The training images outside the holdout (the ones a checkpoint is trained on):
    (x (N', C, H, W) normalised, y (N',) labels, positions (N',) in the training split)."""
    trained = np.flatnonzero(~job.data.holdout)
    return job.data.normalized("train", trained), job.data.train_labels[trained], trained


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
