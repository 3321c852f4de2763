"""Per-checkpoint evaluation: accuracy and loss per class and per task cohort, and per data group;
a regression's squared error, absolute error and R² per split and data group
(:func:`evaluate_regression`).

A cohort is the set of classes introduced in the same task. At checkpoint epoch E the "new" cohort
is the one most recently trained (the task that ended at or is running at E) and the "old" cohorts
are those trained before it; classes not yet introduced are not evaluated (their logits are not
part of the restricted output). Data with groups (a column of each image's cohort, e.g. its
source: ``data.images.group_column``) is also evaluated per group (:func:`group_table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from epochlens.data import Dataset
from epochlens.data.text import TextDataset
from epochlens.outcome import LM_CLASS_NAME, sample_classes
from epochlens.schedule import ClassSchedule, task_at_epoch

if TYPE_CHECKING:  # torch is imported by the functions that run a model: the tables need none
    import torch
    from torch import nn


def predict(
    model: nn.Module,
    images: torch.Tensor | Mapping[str, torch.Tensor],
    targets: np.ndarray,
    active_classes: np.ndarray,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample correctness (bool) and cross-entropy over the restricted logits, eval mode.

    ``images``: a tensor (N, ...) of model inputs (or rows read a batch at a time:
    :class:`epochlens.data.rows.NormalizedRows`), or a mapping of them for keyword inputs (a text
    model's ``input_ids`` and ``attention_mask``), each with N rows. ``targets`` (N, L): a causal
    LM's token labels or a text-to-text model's decoder labels (N, T), its outcome on them
    (:func:`epochlens.outcome.sequence_outcome`)."""
    import torch

    from epochlens.batches import to_device
    from epochlens.models.networks import restrict_logits
    from epochlens.outcome import sequence_outcome, shifts
    from epochlens.tasks import call_model

    model.eval().to(device)
    correct, losses = [], []
    t = torch.as_tensor(targets)
    with torch.no_grad():
        for start in range(0, len(t), batch_size):
            rows = slice(start, start + batch_size)
            if isinstance(images, Mapping):
                xb = to_device({k: v[rows] for k, v in images.items()}, device)
            else:
                xb = images[rows].to(device)
            yb = t[rows].to(device)
            if yb.ndim == 2:  # a causal LM's token labels, or a text-to-text model's decoder labels
                hit, loss = sequence_outcome(call_model(model, xb), yb, shift=shifts(xb))
                losses.append(loss.float().cpu())
                correct.append(hit.cpu())
                continue
            logits = restrict_logits(call_model(model, xb), active_classes)
            losses.append(torch.nn.functional.cross_entropy(logits, yb, reduction="none").cpu())
            correct.append((logits.argmax(1) == yb).cpu())
    if not correct:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.float32)
    return torch.cat(correct).numpy(), torch.cat(losses).numpy()


def evaluate_checkpoint(
    model: nn.Module,
    data: Dataset | TextDataset,
    schedule: ClassSchedule | None,
    epoch: int,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> pd.DataFrame:
    """Tidy per-class table for one checkpoint on the test set and the training holdout.

    Columns: epoch, split, class_id, class_name, position (in the class order), cohort (task that
    introduced it), n, n_correct, accuracy, mean_loss. Data with groups: one row per class and
    group, the group's name in a ``data_group`` column after ``class_name``. A causal LM's or a
    text-to-text model's data (no classes, no ``schedule``): every sample in class 0,
    :data:`epochlens.outcome.LM_CLASS_NAME`;
    accuracy is exact match and the loss the mean NLL of the target tokens.
    """
    from epochlens.data.rows import NormalizedRows
    from epochlens.models.networks import positions_in

    lm = isinstance(data, TextDataset) and data.token_labels
    if lm:  # no classes: every sample in the one class of its target tokens (epochlens.outcome)
        active, cohort, position, class_names = np.zeros(1, np.int64), [0], [0], [LM_CLASS_NAME]
    else:
        assert schedule is not None, "a classifier's evaluation needs its class schedule"
        active, cohort = schedule.active_classes(epoch), schedule.task_of_class()
        position, class_names = np.argsort(schedule.class_order), data.class_names
    rows = []
    for split, mask_fn in (
        ("test", lambda labels: np.ones(len(labels), dtype=bool)),
        ("holdout", lambda labels: data.holdout),
    ):
        base = "test" if split == "test" else "train"
        labels = sample_classes(data.labels(base))
        idx = np.flatnonzero(mask_fn(labels) & np.isin(labels, active))
        if len(idx) == 0:
            continue
        correct, loss = predict(
            model,
            data.rows(base, idx) if isinstance(data, TextDataset) else NormalizedRows(data, base, idx),
            data.labels(base)[idx] if lm else positions_in(labels[idx], active),
            active,
            batch_size,
            device,
        )
        frame = pd.DataFrame({"class_id": labels[idx], "correct": correct, "loss": loss})
        keys = ["class_id"]
        groups = data.test_groups if base == "test" else data.train_groups
        if groups is not None:
            frame["data_group"] = np.asarray(data.group_names, dtype=object)[groups[idx]]
            keys.append("data_group")
        for key, group in frame.groupby(keys, sort=True):
            class_id = int(key[0])
            rows.append(
                dict(
                    epoch=epoch,
                    split=split,
                    class_id=class_id,
                    class_name=class_names[class_id],
                    **({"data_group": key[1]} if groups is not None else {}),
                    position=int(position[class_id]),
                    cohort=int(cohort[class_id]),
                    n=len(group),
                    n_correct=int(group["correct"].sum()),
                    accuracy=float(group["correct"].mean()),
                    mean_loss=float(group["loss"].mean()),
                )
            )
    return pd.DataFrame(rows)


#: Columns of a regression's evaluation table (after run and index), one row per split and data
#: group ("all": the whole split).
REGRESSION_COLUMNS = ("epoch", "split", "data_group", "n", "mean_loss", "mse", "mae", "r2")
REGRESSION_METRICS = ("mean_loss", "mse", "mae", "r2")


def regression_metrics(prediction: np.ndarray, targets: np.ndarray, loss: np.ndarray) -> dict[str, float]:
    """n, mean per-sample loss, MSE and MAE over every value, and R² (as scikit-learn's
    ``r2_score``, averaged over the D outputs; NaN for fewer than two samples) of one group of
    samples, in float64."""
    from epochlens.stats import r2_score

    y = np.asarray(targets, dtype=np.float64).reshape(len(targets), -1)
    z = np.asarray(prediction, dtype=np.float64).reshape(len(prediction), -1)
    return dict(
        n=len(y),
        mean_loss=float(np.mean(loss)),
        mse=float(np.mean((y - z) ** 2)),
        mae=float(np.mean(np.abs(y - z))),
        r2=r2_score(y, z),
    )


def evaluate_regression(
    model: nn.Module,
    data: Dataset,
    epoch: int,
    reduction: str = "mean",
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> pd.DataFrame:
    """A regression checkpoint on the test split and the training holdout: one row per split and
    data group (``all``, then each group of data with groups), columns :data:`REGRESSION_COLUMNS`.
    ``mean_loss`` is the mean per-sample loss of the run's task (squared error, mean or sum over a
    sample's values), ``mse`` and ``mae`` the mean over every value of every sample."""
    from epochlens.data.rows import NormalizedRows
    from epochlens.tasks.regression import predict_regression

    rows = []
    for split, base in (("test", "test"), ("holdout", "train")):
        idx = np.arange(len(data.labels(base))) if split == "test" else np.flatnonzero(data.holdout)
        if len(idx) == 0:
            continue
        targets = data.labels(base)[idx]
        pred, loss = predict_regression(
            model, NormalizedRows(data, base, idx), targets, reduction, batch_size, device
        )
        parts = [("all", np.ones(len(idx), dtype=bool))]
        groups = data.groups(base)
        if groups is not None:
            parts += [(name, groups[idx] == g) for g, name in enumerate(data.group_names)]
        for name, mask in parts:
            if mask.any():
                metrics = regression_metrics(pred[mask], targets[mask], loss[mask])
                rows.append(dict(epoch=epoch, split=split, data_group=name, **metrics))
    return pd.DataFrame(rows, columns=list(REGRESSION_COLUMNS))


def regression_summary(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean, std and Student-t 95% half-width over replicate indices of each regression metric,
    per (run, epoch, split, data group) of a run's concatenated evaluation tables."""
    from epochlens.stats import over_replicates

    keys = ["run", "epoch", *(["train_epoch"] if "train_epoch" in metrics else []), "split", "data_group"]
    return over_replicates(metrics, keys, list(REGRESSION_METRICS))


GROUP_COLUMNS = ("index", "epoch", "split", "data_group", "n", "n_correct", "accuracy", "mean_loss")


def group_table(per_class: pd.DataFrame) -> pd.DataFrame:
    """Accuracy and mean loss per data group (``data_group`` of a per-class table: any number of
    indices and epochs), sample-weighted over the classes; no rows for data without groups.
    Columns: :data:`GROUP_COLUMNS` (and ``train_epoch`` after ``epoch`` when the table has it)."""
    keys = ["index", "epoch", *(["train_epoch"] if "train_epoch" in per_class else []), "split", "data_group"]
    columns = [*keys, *GROUP_COLUMNS[4:]]
    if "data_group" not in per_class or per_class.empty:
        return pd.DataFrame(columns=columns)
    df = per_class.assign(loss_sum=per_class["mean_loss"] * per_class["n"])
    out = df.groupby(keys, as_index=False, sort=True)[["n", "n_correct", "loss_sum"]].sum()
    out["accuracy"] = out["n_correct"] / out["n"]
    out["mean_loss"] = out["loss_sum"] / out["n"]
    return out[columns]


def cohort_table(per_class: pd.DataFrame, epochs_per_task: int) -> pd.DataFrame:
    """Aggregate a per-class table (any number of runs/indices/epochs) to cohorts and old/new.

    Returns rows per (index, epoch, split, group) where group is ``cohort <k>``, ``old`` or ``new``,
    with n, n_correct and accuracy = n_correct / n (sample-weighted).
    """
    df = per_class.copy()
    newest = task_at_epoch(df["epoch"].to_numpy(), epochs_per_task)
    df["age"] = np.where(df["cohort"] == newest, "new", "old")
    keys = ["index", "epoch", "split"]
    parts = []
    by_cohort = df.groupby([*keys, "cohort"], as_index=False)[["n", "n_correct"]].sum()
    by_cohort["group"] = "cohort " + by_cohort["cohort"].astype(str)
    by_age = df.groupby([*keys, "age"], as_index=False)[["n", "n_correct"]].sum()
    by_age["group"] = by_age["age"]
    by_age["cohort"] = -1
    for g in (by_cohort, by_age):
        parts.append(g[[*keys, "group", "cohort", "n", "n_correct"]])
    out = pd.concat(parts, ignore_index=True)
    out["accuracy"] = out["n_correct"] / out["n"]
    return out.sort_values([*keys, "cohort", "group"]).reset_index(drop=True)
