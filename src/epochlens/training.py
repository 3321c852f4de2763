"""Class-incremental training with checkpoints at task boundaries (loss-of-plasticity protocol).

For each task: train on the training images (holdout excluded) of the classes active in that task,
with the loss on the restricted logits; evaluate holdout accuracy after every epoch; with early
stopping, restore the weights of the best holdout epoch at the end of the task; then write the
boundary checkpoint, before the next task's classes are added. The learning rate restarts at each
task and decays by ``lr_decay`` at fixed fractions of the task (0.3, 0.6, 0.8 of it, as 60/120/160 of
200 epochs in the original).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens.checkpoints import save_state_dict
from epochlens.data import Dataset
from epochlens.models import positions_in, restrict_logits
from epochlens.progress import progress_bar
from epochlens.schedule import ClassSchedule


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
    seed: int = field(default=0, metadata={"help": "seed of initialisation and batch order"})


def _augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random horizontal flip and 4-pixel reflect-padded random crop."""
    b, _, hgt, wid = x.shape
    flip = torch.rand(b, generator=generator) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    padded = nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    dy, dx = torch.randint(0, 9, (2,), generator=generator).tolist()
    return padded[:, :, dy : dy + hgt, dx : dx + wid]


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, active: np.ndarray) -> float:
    """Top-1 accuracy over the restricted logits, in eval mode."""
    model.eval()
    correct = 0
    for start in range(0, len(x), 1024):
        logits = restrict_logits(model(x[start : start + 1024]), active)
        correct += int((logits.argmax(1) == targets[start : start + 1024]).sum())
    return correct / max(len(x), 1)


def train_incremental(
    model: nn.Module,
    data: Dataset,
    schedule: ClassSchedule,
    settings: TrainSettings,
    checkpoint_path: Callable[[int], Path],
    save_every: int | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> pd.DataFrame:
    """Train ``model`` through every task of ``schedule``; return the per-epoch training log.

    Writes ``checkpoint_path(epoch)`` for every epoch of ``schedule.checkpoint_epochs(save_every)``.
    The log has one row per epoch: epoch, task, num_active, lr, train_loss, train_accuracy,
    holdout_accuracy.
    """
    device = torch.device(device)
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    model.to(device)
    save_at = set(schedule.checkpoint_epochs(save_every))
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=settings.lr,
        momentum=settings.momentum,
        weight_decay=settings.weight_decay,
    )
    x_all = data.normalized("train").to(device)
    labels = data.train_labels
    holdout = data.holdout
    ept = schedule.epochs_per_task
    milestones = sorted({round(f * ept) for f in settings.lr_milestones if 0 < f < 1})

    save_state_dict(model, checkpoint_path(0))
    log = []
    bar = progress_bar(total=schedule.final_epoch, desc="training", disable=not progress)
    for task in range(schedule.num_tasks):
        first_epoch = task * ept + 1
        active = schedule.active_classes(first_epoch)
        in_task = np.isin(labels, active)
        train_idx = np.flatnonzero(in_task & ~holdout)
        val_idx = np.flatnonzero(in_task & holdout)
        targets = torch.as_tensor(positions_in(labels, active), device=device)
        best_acc, best_state = -1.0, None
        for epoch_in_task in range(ept):
            epoch = task * ept + epoch_in_task + 1
            lr = settings.lr * settings.lr_decay ** sum(epoch_in_task >= m for m in milestones)
            for group in optimizer.param_groups:
                group["lr"] = lr
            model.train()
            order = train_idx[torch.randperm(len(train_idx), generator=generator).numpy()]
            total_loss, total_correct = 0.0, 0
            for start in range(0, len(order), settings.batch_size):
                batch = torch.as_tensor(order[start : start + settings.batch_size], device=device)
                xb, yb = x_all[batch], targets[batch]
                if settings.augment == "flip_crop":
                    xb = _augment(xb, generator)
                logits = restrict_logits(model(xb), active)
                loss = nn.functional.cross_entropy(logits, yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total_loss += float(loss.detach()) * len(batch)
                total_correct += int((logits.argmax(1) == yb).sum())
            val_acc = float("nan")
            if len(val_idx):
                vi = torch.as_tensor(val_idx, device=device)
                val_acc = accuracy(model, x_all[vi], targets[vi], active)
                if settings.early_stopping and val_acc > best_acc:
                    best_acc, best_state = val_acc, copy.deepcopy(model.state_dict())
            is_task_end = epoch_in_task == ept - 1
            if is_task_end and settings.early_stopping and best_state is not None:
                model.load_state_dict(best_state)
            if epoch in save_at:
                save_state_dict(model, checkpoint_path(epoch))
            log.append(
                dict(
                    epoch=epoch,
                    task=task,
                    num_active=len(active),
                    lr=lr,
                    train_loss=total_loss / max(len(order), 1),
                    train_accuracy=total_correct / max(len(order), 1),
                    holdout_accuracy=val_acc,
                )
            )
            bar.update(1)
            bar.set_postfix(task=task, holdout=f"{val_acc:.3f}")
    bar.close()
    return pd.DataFrame(log)
