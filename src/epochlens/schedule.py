"""Class-incremental schedules: which classes a checkpoint's model was trained on.

Semantics follow the loss-of-plasticity incremental CIFAR experiment: training starts with
``initial_classes`` classes and adds ``increment`` classes every ``epochs_per_task`` epochs.
Checkpoints are written at a task boundary *after* the task's training and *before* the classes are
extended, so with 5 initial classes, +5 every 200 epochs:

====== ========================= =================
epoch  model state               active classes
====== ========================= =================
0      untrained                 first 5 (task 0)
200    trained on task 0         first 5
400    trained on tasks 0..1     first 10
200k   trained on tasks 0..k-1   first 5k
====== ========================= =================

A checkpoint written inside a task (``0 < E mod epochs_per_task``) is being trained on that task's
classes: the first ``initial + increment * floor(E / epochs_per_task)`` classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from epochlens.errors import ClassOrderError, ConfigError


@dataclass(frozen=True)
class ClassSchedule:
    """A class order plus the rule that extends the set of trained classes over epochs.

    Attributes:
        class_order: int64 permutation of ``range(num_classes)``; position p holds the class id
            introduced p-th.
        initial_classes: classes in the first task.
        increment: classes added at each task boundary.
        epochs_per_task: epochs between two boundaries.
    """

    class_order: np.ndarray
    initial_classes: int | None
    increment: int
    epochs_per_task: int

    def __post_init__(self) -> None:
        order = np.asarray(self.class_order)
        # Check before converting: astype would turn a float order into ints, fail on strings, and
        # len() fails on a 0-d array; all of these must be ClassOrderError.
        check_permutation(order, order.size, source="class_order")
        object.__setattr__(self, "class_order", order.astype(np.int64))
        n = len(order)
        if self.initial_classes is None:  # schedule: none, every class from the start
            object.__setattr__(self, "initial_classes", n)
        if not 1 <= self.initial_classes <= n:
            raise ConfigError(
                f"schedule.initial_classes={self.initial_classes} must be in 1..{n} (the number of "
                "classes in the data set); fix it in the config."
            )
        if self.increment < 0:
            raise ConfigError(f"schedule.increment={self.increment} must be >= 0.")
        if self.epochs_per_task < 1:
            raise ConfigError(f"schedule.epochs_per_task={self.epochs_per_task} must be >= 1.")

    @property
    def num_classes(self) -> int:
        return len(self.class_order)

    @property
    def num_tasks(self) -> int:
        """Tasks until every class is in: 1 + ceil((num_classes - initial) / increment)."""
        remaining = self.num_classes - self.initial_classes
        if remaining == 0 or self.increment == 0:
            return 1
        return 1 + -(-remaining // self.increment)

    @property
    def final_epoch(self) -> int:
        """Epoch of the last checkpoint: after the last task's training."""
        return self.num_tasks * self.epochs_per_task

    def num_active(self, epoch: int) -> int:
        """Number of classes the model at checkpoint ``epoch`` has been trained on (see module doc)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        task = int(task_at_epoch(epoch, self.epochs_per_task))
        return min(self.num_classes, self.initial_classes + self.increment * task)

    def active_classes(self, epoch: int) -> np.ndarray:
        """Class ids (in order of introduction) the model at checkpoint ``epoch`` was trained on."""
        return self.class_order[: self.num_active(epoch)].copy()

    def new_classes(self, epoch: int) -> np.ndarray:
        """Active classes of the task most recently trained at checkpoint ``epoch`` (the "new"
        cohort; the other active classes are "old")."""
        active = self.active_classes(epoch)
        newest = int(task_at_epoch(epoch, self.epochs_per_task))
        return active[self.task_of_class()[active] == newest]

    def task_of_class(self) -> np.ndarray:
        """Array indexed by class id giving the task (cohort) in which the class was introduced."""
        position = np.empty(self.num_classes, dtype=np.int64)
        position[self.class_order] = np.arange(self.num_classes)
        task = np.where(
            position < self.initial_classes,
            0,
            1 + (position - self.initial_classes) // max(self.increment, 1),
        )
        return task.astype(np.int64)

    def task_epochs(self, task: int) -> tuple[int, int]:
        """Epoch interval (start, end] during which ``task`` is trained."""
        return task * self.epochs_per_task, (task + 1) * self.epochs_per_task

    def checkpoint_epochs(self, save_every: int | None = None) -> list[int]:
        """Epochs at which checkpoints exist: every task boundary, plus every ``save_every`` epochs."""
        step = save_every or self.epochs_per_task
        epochs = set(range(0, self.final_epoch + 1, self.epochs_per_task))
        epochs.update(range(0, self.final_epoch + 1, step))
        return sorted(epochs)


#: ``schedule: none`` (every class trained at every checkpoint: an ordinary training run) as a
#: schedule: all classes in one task that never ends (the config normalises it to this mapping,
#: so every rule and table reads one kind of schedule).
NO_SCHEDULE = {"initial_classes": None, "increment": 0, "epochs_per_task": 10**9}


def is_no_schedule(spec: dict | str) -> bool:
    """Whether a run's ``schedule`` section is ``none`` (as written, or normalised)."""
    return spec == "none" or (isinstance(spec, dict) and spec.get("initial_classes", 0) is None)


def task_at_epoch(epoch, epochs_per_task: int):
    """Task most recently trained at checkpoint ``epoch`` (scalar or array); 0 for epoch 0.

    Training during epochs (E-1, E] belongs to task (E-1) // epochs_per_task, so a boundary
    checkpoint belongs to the task it ends.
    """
    epoch = np.asarray(epoch)
    return np.where(epoch == 0, 0, (epoch - 1) // epochs_per_task)


def check_permutation(order: np.ndarray, num_classes: int, source: str | Path) -> None:
    """Raise ClassOrderError unless ``order`` is a permutation of ``range(num_classes)``."""
    order = np.asarray(order)
    if order.ndim != 1 or not np.issubdtype(order.dtype, np.integer):
        raise ClassOrderError(
            f"{source}: a class order must be a 1-D integer array, got shape {order.shape} and "
            f"dtype {order.dtype}. Save it with np.save(path, np.random.permutation(n))."
        )
    if len(order) != num_classes:
        raise ClassOrderError(
            f"{source}: the class order has {len(order)} entries but the data set has {num_classes} "
            "classes. Point the config at the class order of this data set."
        )
    if not np.array_equal(np.sort(order), np.arange(num_classes)):
        missing = sorted(set(range(num_classes)) - set(order.tolist()))
        dupes = sorted({int(c) for c in order if (order == c).sum() > 1})
        raise ClassOrderError(
            f"{source}: the class order is not a permutation of 0..{num_classes - 1} "
            f"(missing {missing[:10]}, repeated {dupes[:10]}). Regenerate it or fix the file."
        )


def make_class_order(num_classes: int, seed: int) -> np.ndarray:
    """A seeded random permutation of the classes (one per replicate index)."""
    return np.random.default_rng(seed).permutation(num_classes).astype(np.int64)


def load_class_order(path: str | Path, num_classes: int) -> np.ndarray:
    """Read a user's ``class_order/index-{i}.npy`` and check it against the data set."""
    path = Path(path)
    if not path.exists():
        raise ClassOrderError(
            f"{path}: class order file not found. Set class_order.path in the config to the run's "
            "class_order/index-{index}.npy, or use class_order.source: seed."
        )
    try:
        order = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for corrupt files
        raise ClassOrderError(f"{path}: not a readable .npy file ({exc}). Re-copy it.") from exc
    check_permutation(order, num_classes, source=path)
    return order.astype(np.int64)


def schedule_from_config(spec: dict, class_order_path: str | Path) -> ClassSchedule:
    """A run's schedule from its ``schedule`` config section and its ``class_order.npy``."""
    order = np.load(class_order_path, allow_pickle=False)
    return ClassSchedule(order, spec["initial_classes"], spec["increment"], spec["epochs_per_task"])
