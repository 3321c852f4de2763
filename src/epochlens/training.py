"""Class-incremental training with checkpoints at task boundaries (loss-of-plasticity protocol).

The data set is images (:class:`epochlens.data.Dataset`, normalised) or a text run's tokens
(:class:`epochlens.data.text.TextDataset`: ``model(input_ids=..., attention_mask=...)``, a model
returning its logits); images train with SGD as in the original, transformers usually with
``optimizer: adamw``. A text-to-text model's data (decoder labels, one class: its target tokens)
trains on the mean over a batch's samples of each one's target tokens' mean NLL, the per-sample
loss every stage reports; its accuracy is exact match.

For each task: train on the training images (holdout excluded) of the classes active in that task,
with the loss on the restricted logits; evaluate holdout accuracy after every epoch; with early
stopping, restore the weights of the best holdout epoch at the end of the task; then write the
boundary checkpoint, before the next task's classes are added. The learning rate restarts at each
task and decays by ``lr_decay`` at fixed fractions of the task (0.3, 0.6, 0.8 of it, as 60/120/160 of
200 epochs in the original).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens import resume as resume_module
from epochlens.atomic import write_atomic
from epochlens.checkpoints import save_state_dict
from epochlens.data import Dataset
from epochlens.data.text import TextDataset
from epochlens.models.networks import positions_in, restrict_logits
from epochlens.outcome import sample_classes, sequence_outcome, shifts
from epochlens.progress import progress_bar
from epochlens.resume import ResumeDir, file_digest, fingerprint, rng_state, set_rng_state
from epochlens.schedule import ClassSchedule

log = logging.getLogger("epochlens")
NORMALISATION = ("scale", "mean", "std")  # an image data set's (a text data set has none)


@dataclass
class TrainSettings:
    """Optimisation settings of class-incremental training."""

    batch_size: int = field(default=64, metadata={"help": "training mini-batch size"})
    lr: float = field(default=0.05, metadata={"help": "SGD learning rate at the start of a task"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})
    weight_decay: float = field(default=5e-4, metadata={"help": "SGD weight decay"})
    lr_decay: float = field(default=0.2, metadata={"help": "factor at each lr milestone"})
    lr_milestones: tuple[float, ...] = field(
        default=(0.3, 0.6, 0.8), metadata={"help": "fractions of a task at which lr decays"}
    )
    early_stopping: bool = field(
        default=True, metadata={"help": "restore the best-holdout weights at each task's end"}
    )
    augment: str = field(default="none", metadata={"help": "none | flip_crop (CIFAR-style)"})
    optimizer: str = field(
        default="sgd", metadata={"help": "sgd (momentum, weight_decay) | adamw (decoupled weight_decay)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of initialisation and batch order"})


def _augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random horizontal flip and 4-pixel reflect-padded random crop."""
    b, _, hgt, wid = x.shape
    flip = torch.rand(b, generator=generator) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    padded = nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    dy, dx = torch.randint(0, 9, (2,), generator=generator).tolist()
    return padded[:, :, dy : dy + hgt, dx : dx + wid]


Inputs = torch.Tensor | dict[str, torch.Tensor]  # images (N, C, H, W) or a text model's keyword inputs


def _rows(x: Inputs, rows: torch.Tensor | slice) -> Inputs:
    return {k: v[rows] for k, v in x.items()} if isinstance(x, dict) else x[rows]


def _forward(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(**x) if isinstance(x, dict) else model(x)


def _training_inputs(data: Dataset | TextDataset, device: torch.device) -> Inputs:
    if isinstance(data, TextDataset):
        return {k: v.to(device) for k, v in data.inputs("train").items()}
    return data.normalized("train").to(device)


@torch.no_grad()
def accuracy(model: nn.Module, x: Inputs, targets: torch.Tensor, active: np.ndarray) -> float:
    """Top-1 accuracy over the restricted logits, in eval mode (token labels: exact match)."""
    model.eval()
    correct = 0
    for start in range(0, len(targets), 1024):
        rows = slice(start, start + 1024)
        correct += _batch_loss(model, _rows(x, rows), targets[rows], active)[1]
    return correct / max(len(targets), 1)


def _batch_loss(
    model: nn.Module, xb: Inputs, yb: torch.Tensor, active: np.ndarray
) -> tuple[torch.Tensor, int]:
    """(mean loss of the batch, number of samples right): cross-entropy over the restricted logits,
    or for token labels (B, T) the mean over samples of each one's target tokens' mean NLL and
    exact match (:func:`epochlens.outcome.sequence_outcome`; a text-to-text model's inputs carry
    its decoder labels)."""
    if yb.ndim == 2:
        hit, losses = sequence_outcome(_forward(model, xb), yb, keep_dtype=True, shift=shifts(xb))
        return losses.mean(), int(hit.sum())
    logits = restrict_logits(_forward(model, xb), active)
    return nn.functional.cross_entropy(logits, yb), int((logits.argmax(1) == yb).sum())


#: Columns of the train log (train_log.csv), in order.
LOG_COLUMNS = (
    "epoch",
    "task",
    "num_active",
    "lr",
    "train_loss",
    "train_accuracy",
    "holdout_accuracy",
)


class TrainLog:
    """The per-epoch train log, written as it grows: a CSV with a header, one row appended (and
    flushed) per finished epoch, so a person (or a crashed job's post-mortem) sees every epoch so
    far. Complete, the file is byte for byte ``pd.DataFrame(rows).to_csv(path, index=False)``.
    Without a path the rows are only kept in memory.
    """

    def __init__(self, path: str | Path | None, rows: list[dict] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.rows: list[dict] = list(rows or [])
        if self.path is not None:  # (re)start the file from the rows so far, atomically
            write_atomic(self.path, lambda p: self._frame(self.rows).to_csv(p, index=False))

    @staticmethod
    def _frame(rows: list[dict]) -> pd.DataFrame:
        return pd.DataFrame(rows, columns=list(LOG_COLUMNS)) if not rows else pd.DataFrame(rows)

    def append(self, row: dict) -> None:
        self.rows.append(row)
        if self.path is not None:
            with open(self.path, "a", newline="") as f:
                pd.DataFrame([row]).to_csv(f, header=False, index=False)

    def table(self) -> pd.DataFrame:
        return self._frame(self.rows)


def resume_key(
    model: nn.Module,
    data: Dataset | TextDataset,
    schedule: ClassSchedule,
    settings: TrainSettings,
    save_every: int | None,
) -> str:
    """Fingerprint of everything a training run's checkpoints depend on: settings, schedule and
    class order, the data (images, labels, holdout, normalisation), the architecture and the code
    of this module. A resume state saved under another key is not resumed."""
    return fingerprint(
        {
            "settings": asdict(settings),
            "schedule": [
                schedule.class_order,
                schedule.initial_classes,
                schedule.increment,
                schedule.epochs_per_task,
            ],
            "checkpoints": schedule.checkpoint_epochs(save_every),
            "data": [
                data.content_hash,
                data.holdout,
                *[getattr(data, k, None) for k in NORMALISATION],
            ],
            "model": [type(model).__name__, [(k, list(v.shape)) for k, v in model.state_dict().items()]],
            "code": file_digest(__file__, resume_module.__file__),
        }
    )


def train_incremental(
    model: nn.Module,
    data: Dataset | TextDataset,
    schedule: ClassSchedule,
    settings: TrainSettings,
    checkpoint_path: Callable[[int], Path],
    save_every: int | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
    log_path: str | Path | None = None,
    resume_dir: str | Path | None = None,
    resume_every: int | None = None,
    start: tuple[int, Mapping[str, torch.Tensor]] | None = None,
    stop_epoch: int | None = None,
) -> pd.DataFrame:
    """Train ``model`` through every task of ``schedule``; return the per-epoch training log.

    Writes ``checkpoint_path(epoch)`` for every epoch of ``schedule.checkpoint_epochs(save_every)``.
    The log has one row per epoch: epoch, task, num_active, lr, train_loss, train_accuracy,
    holdout_accuracy; with ``log_path`` it is also written there as it grows (see :class:`TrainLog`).

    With ``resume_dir`` (see :mod:`epochlens.resume`) the job saves its resume state there after
    every checkpoint and every ``resume_every`` epochs, and starts from the saved state when one
    of the same settings exists: an interrupted job, run again, ends with the same checkpoints
    and log, byte for byte, as one that never stopped (same device and software). The folder is
    left in place; the caller deletes it (:meth:`ResumeDir.clear`) once the job's outputs are all
    written.

    ``start`` = (epoch E0, weights): begin from those weights as the model after epoch E0 and train
    epochs E0 + 1 on with the recipe of those epochs (classes, learning rate; a fresh optimizer and
    shuffling generator): the warm start of the LDS retrainings. ``stop_epoch``: stop after that
    epoch instead of the schedule's last (the checkpoints up to it are those of a full run).
    """
    device = torch.device(device)
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    model.to(device)
    save_at = set(schedule.checkpoint_epochs(save_every))
    optimizer = _optimizer(model, settings)
    x_all = _training_inputs(data, device)
    ept = schedule.epochs_per_task
    milestones = sorted({round(f * ept) for f in settings.lr_milestones if 0 < f < 1})
    if start is not None and resume_dir is not None:
        raise ValueError("train_incremental: a warm start (start) is not resumable; give one of the two")
    last = schedule.final_epoch if stop_epoch is None else min(int(stop_epoch), schedule.final_epoch)
    resume = (
        None
        if resume_dir is None
        else ResumeDir(resume_dir, resume_key(model, data, schedule, settings, save_every))
    )
    run = _Run(model, optimizer, generator, checkpoint_path, resume, ept)
    first = run.begin(schedule, start, log_path)
    bar = progress_bar(
        total=last,
        initial=first - 1,
        desc="training",
        unit="epoch",
        disable=not progress,
        line_every=0,
    )
    rows = None
    for epoch in range(first, last + 1):
        task, epoch_in_task = divmod(epoch - 1, ept)
        if rows is None or rows[0] != task:
            rows = (task, *_task_rows(data, schedule, task, device))
        val_acc = _epoch(run, epoch, epoch_in_task == ept - 1, rows, settings, milestones, x_all, device)
        run.saves(epoch, save_at, resume_every)
        bar.set_postfix(task=task, holdout=f"{val_acc:.3f}", refresh=False)
        bar.update(1)
    bar.close()
    return run.train_log.table()


def _epoch(
    run: _Run,
    epoch: int,
    task_end: bool,
    rows: tuple,
    settings: TrainSettings,
    milestones: list[int],
    x_all: Inputs,
    device: torch.device,
) -> float:
    """One epoch of a task (``rows``: task, active classes, training rows, holdout rows, targets) at
    its learning rate, its holdout accuracy (with early stopping, the task's best weights restored at
    its end), logged; the holdout accuracy."""
    task, active, train_idx, val_idx, targets = rows
    epoch_in_task = (epoch - 1) % run.epochs_per_task
    if epoch_in_task == 0:
        run.best_acc, run.best_state = -1.0, None
    lr = settings.lr * settings.lr_decay ** sum(epoch_in_task >= m for m in milestones)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    n, total_loss, total_correct = _train_epoch(run, x_all, targets, train_idx, active, settings, device)
    val_acc = run.holdout_accuracy(x_all, targets, val_idx, active, settings.early_stopping, device)
    if task_end and settings.early_stopping and run.best_state is not None:
        run.model.load_state_dict(run.best_state)
    run.train_log.append(
        dict(
            epoch=epoch,
            task=task,
            num_active=len(active),
            lr=lr,
            train_loss=total_loss / max(n, 1),
            train_accuracy=total_correct / max(n, 1),
            holdout_accuracy=val_acc,
        )
    )
    return val_acc


def _optimizer(model: nn.Module, settings: TrainSettings) -> torch.optim.Optimizer:
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    return torch.optim.SGD(
        model.parameters(),
        lr=settings.lr,
        momentum=settings.momentum,
        weight_decay=settings.weight_decay,
    )


def _task_rows(
    data: Dataset | TextDataset, schedule: ClassSchedule, task: int, device: torch.device
) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]:
    """(active classes, training rows, holdout rows, targets (N,) or (N, T)) of a task: the
    samples of its active classes; targets are positions among them (token labels as they are)."""
    labels = data.train_labels
    token_labels = labels.ndim == 2  # a text-to-text model's decoder labels: one class, 0
    active = schedule.active_classes(task * schedule.epochs_per_task + 1)
    in_task = np.isin(sample_classes(labels), active)
    train_idx = np.flatnonzero(in_task & ~data.holdout)
    val_idx = np.flatnonzero(in_task & data.holdout)
    targets = torch.as_tensor(labels if token_labels else positions_in(labels, active), device=device)
    return active, train_idx, val_idx, targets


def _train_epoch(
    run: _Run,
    x_all: Inputs,
    targets: torch.Tensor,
    train_idx: np.ndarray,
    active: np.ndarray,
    settings: TrainSettings,
    device: torch.device,
) -> tuple[int, float, int]:
    """One epoch over the task's training rows in the generator's order: (samples, summed loss,
    samples right)."""
    model, optimizer = run.model, run.optimizer
    model.train()
    order = train_idx[torch.randperm(len(train_idx), generator=run.generator).numpy()]
    total_loss, total_correct = 0.0, 0
    for start in range(0, len(order), settings.batch_size):
        batch = torch.as_tensor(order[start : start + settings.batch_size], device=device)
        xb, yb = _rows(x_all, batch), targets[batch]
        if settings.augment == "flip_crop":
            xb = _augment(xb, run.generator)
        loss, n_correct = _batch_loss(model, xb, yb, active)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total_loss += float(loss.detach()) * len(batch)
        total_correct += n_correct
    return len(order), total_loss, total_correct


@dataclass
class _Run:
    """What a training job carries from epoch to epoch (and saves in its resume state): the model,
    optimizer and shuffling generator, the best holdout accuracy of the task so far (early
    stopping), the checkpoints kept in the resume folder and the train log."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    checkpoint_path: Callable[[int], Path]
    resume: ResumeDir | None
    epochs_per_task: int
    kept: dict[int, str] = field(default_factory=dict)  # checkpoint epoch -> file name in the resume folder
    best_acc: float = -1.0
    best_state: dict | None = None
    train_log: TrainLog | None = None

    def begin(
        self, schedule: ClassSchedule, start: tuple[int, Mapping[str, torch.Tensor]] | None, log_path
    ) -> int:
        """The first epoch to train: after a saved resume state (restored), after a warm start's
        epoch, or 1 (the untrained model saved as checkpoint 0)."""
        state = self.resume.load() if self.resume is not None else None
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.best_acc, self.best_state = state["best_acc"], state["best_state"]
            set_rng_state(state["rng"], self.generator)
            self.kept = dict(state["checkpoints"])
            for epoch, name in self.kept.items():
                self.resume.restore(name, self.checkpoint_path(epoch))
            first = state["epoch"] + 1
            log.info(
                "resuming training at epoch %d of %d (state in %s)",
                first,
                schedule.final_epoch,
                self.resume.folder,
            )
        elif start is not None:
            self.model.load_state_dict(start[1])
            first = int(start[0]) + 1
        else:
            first = 1
        self.train_log = TrainLog(log_path, state["log"] if state is not None else [])
        if state is None and start is None:
            self.save_checkpoint(0)
            if self.resume is not None:
                self.save_state(0)
        return first

    def holdout_accuracy(
        self, x_all: Inputs, targets: torch.Tensor, val_idx: np.ndarray, active, early_stopping: bool, device
    ) -> float:
        """Accuracy on the task's holdout rows (NaN without any); with early stopping the best
        weights of the task so far are kept."""
        if not len(val_idx):
            return float("nan")
        vi = torch.as_tensor(val_idx, device=device)
        val_acc = accuracy(self.model, _rows(x_all, vi), targets[vi], active)
        if early_stopping and val_acc > self.best_acc:
            self.best_acc, self.best_state = val_acc, copy.deepcopy(self.model.state_dict())
        return val_acc

    def saves(self, epoch: int, save_at: set[int], resume_every: int | None) -> None:
        if epoch in save_at:
            self.save_checkpoint(epoch)
        if self.resume is not None and (epoch in save_at or (resume_every and epoch % resume_every == 0)):
            self.save_state(epoch)

    def save_state(self, epoch: int) -> None:
        self.resume.save(
            {
                "epoch": epoch,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "best_acc": self.best_acc,
                "best_state": self.best_state,
                "rng": rng_state(self.generator),
                "checkpoints": self.kept,
                "log": self.train_log.rows,
            }
        )

    def save_checkpoint(self, epoch: int) -> None:
        path = self.checkpoint_path(epoch)
        save_state_dict(self.model, path)
        if self.resume is not None:
            self.kept[epoch] = self.resume.keep(path)
