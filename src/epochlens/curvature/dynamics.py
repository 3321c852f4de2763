"""Per-sample statistics across checkpoints: CSL, learning time, forgetting, curvature by cohort.

Input: for one (run, index), the merged curvature results of several checkpoint epochs
(:func:`epochlens.curvature.io.read_epoch`), where a sample's values are NaN at epochs before its
class was trained. Over the epochs E₁ < … < E_m at which sample x is active:

    csl(x)                  = Σ_e loss_e(x)           cumulative sample loss (Ravikumar et al. 2024)
    csl_mean(x)             = csl(x) / m              comparable across cohorts with different m
    cumulative_grad_norm(x) = Σ_e ‖g_e(x)‖₂           cumulative input-gradient norm
    learning_time(x)        = first active E_j such that x is classified correctly at E_j and at
                              every later analysed epoch (NaN if it is wrong at the last one)
    epochs_to_learn(x)      = learning_time(x) − the epoch at which the task that introduced x's
                              class started training (k · epochs_per_task for task k)
    forgetting_events(x)    = number of correct → wrong transitions between consecutive active
                              epochs (Toneva et al. 2019)

A regression's sample is "correct" when its loss is at most the run's learned threshold
(``curvature.tolerance`` times the loss of predicting the training targets' mean; the threshold is
in each epoch's metadata): its learning time is the first checkpoint from which its loss stays
below the threshold, a forgetting event a rise above it, and the cohort tables call the fraction of
such samples ``learned`` instead of ``accuracy``.

The sums run over the *analysed* checkpoints, not over every training epoch: they rank samples
within one run (which is what they are used for), and their scale depends on how many checkpoints
were analysed; csl_mean does not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from epochlens.curvature.io import read_epoch
from epochlens.errors import EpochlensError
from epochlens.schedule import schedule_from_config, task_at_epoch
from epochlens.stats import over_replicates

log = logging.getLogger("epochlens")

#: Quantiles of the per-cohort curvature table (enough for box plots: whiskers at 5%/95%).
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def _stack(per_epoch: Sequence[dict], key: str) -> np.ndarray:
    return np.stack([np.asarray(e[key]) for e in per_epoch])  # (m epochs, N)


def _check(epochs: Sequence[int], per_epoch: Sequence[dict]) -> None:
    if len(epochs) != len(per_epoch) or not epochs:
        raise ValueError("need one result dict per epoch, at least one epoch")
    if list(epochs) != sorted(set(epochs)):
        raise ValueError(f"epochs must be strictly increasing, got {list(epochs)}")
    labels = [np.asarray(e["labels"]) for e in per_epoch]
    for epoch, lab in zip(epochs, labels, strict=True):
        if lab.shape != labels[0].shape or not np.array_equal(lab, labels[0]):
            raise EpochlensError(
                f"epoch {epoch}: per_image_labels differ from epoch {epochs[0]}'s; the epochs were "
                "computed on different data. Rerun the curvature of this run."
            )


def sample_dynamics(
    epochs: Sequence[int], per_epoch: Sequence[dict], task_of_class: np.ndarray, epochs_per_task: int
) -> pd.DataFrame:
    """One row per training sample with the statistics of the module doc.

    Args:
        epochs: analysed checkpoint epochs, increasing.
        per_epoch: for each epoch, arrays of length N: ``loss``, ``grad_norm``, ``curvature``,
            ``correct`` (bool), ``labels``, ``holdout`` (bool); NaN loss marks an inactive sample.
        task_of_class: task (cohort) of each class id, see ClassSchedule.task_of_class.
        epochs_per_task: training epochs per task (task k starts at epoch k · epochs_per_task).

    Returns:
        DataFrame with columns sample, label, task, holdout, first_active_epoch, n_epochs, csl,
        csl_mean, cumulative_grad_norm, learning_time, epochs_to_learn, forgetting_events,
        curvature_mean, curvature_max, curvature_final, loss_final, correct_final. Samples never
        active have n_epochs 0 and NaN statistics.
    """
    _check(epochs, per_epoch)
    epochs_arr = np.asarray(epochs, dtype=np.float64)
    loss = _stack(per_epoch, "loss").astype(np.float64)
    grad = _stack(per_epoch, "grad_norm").astype(np.float64)
    curv = _stack(per_epoch, "curvature").astype(np.float64)
    correct = _stack(per_epoch, "correct").astype(bool)
    labels = np.asarray(per_epoch[0]["labels"])
    task = np.asarray(task_of_class)[labels]
    active = np.isfinite(loss)
    n_epochs = active.sum(0)
    seen = n_epochs > 0

    with np.errstate(invalid="ignore", divide="ignore"):
        csl = np.where(seen, np.nansum(loss, 0), np.nan)
        csg = np.where(seen, np.nansum(grad, 0), np.nan)
        curv_mean = np.where(seen, np.nansum(curv, 0) / n_epochs, np.nan)
    curv_max = np.where(seen, np.max(np.where(active, curv, -np.inf), 0), np.nan)
    first = np.where(seen, epochs_arr[np.argmax(active, 0)], np.nan)
    last = len(epochs) - 1 - np.argmax(active[::-1], 0)  # last active epoch (index)
    cols = np.arange(loss.shape[1])

    # Learning time: the start of the final run of correct active epochs. A sample counts as
    # wrong at inactive epochs only before it becomes active (after, it stays active).
    wrong_or_inactive = ~(correct & active)
    # index of the last epoch at which the sample was wrong (or -1 if never)
    last_wrong = np.where(
        wrong_or_inactive.any(0), len(epochs) - 1 - np.argmax(wrong_or_inactive[::-1], 0), -1
    )
    learned = seen & (last_wrong < len(epochs) - 1)
    learning_time = np.where(learned, epochs_arr[np.minimum(last_wrong + 1, len(epochs) - 1)], np.nan)

    both = active[:-1] & active[1:]
    forgetting = (both & correct[:-1] & ~correct[1:]).sum(0)

    return pd.DataFrame(
        {
            "sample": cols,
            "label": labels,
            "task": task,
            "holdout": np.asarray(per_epoch[0]["holdout"], dtype=bool),
            "first_active_epoch": first,
            "n_epochs": n_epochs,
            "csl": csl,
            "csl_mean": csl / np.where(seen, n_epochs, 1),
            "cumulative_grad_norm": csg,
            "learning_time": learning_time,
            "epochs_to_learn": learning_time - task * epochs_per_task,
            "forgetting_events": np.where(seen, forgetting, 0),
            "curvature_mean": curv_mean,
            "curvature_max": curv_max,
            "curvature_final": np.where(seen, curv[last, cols], np.nan),
            "loss_final": np.where(seen, loss[last, cols], np.nan),
            "correct_final": seen & correct[last, cols],
        }
    )


def cohort_curvature(
    epochs: Sequence[int],
    per_epoch: Sequence[dict],
    sample_task: np.ndarray,
    epochs_per_task: int,
    sample_group: np.ndarray | None = None,
    correct_name: str = "accuracy",
) -> pd.DataFrame:
    """Curvature, loss and accuracy per (epoch, group) over the active samples (the share of
    correct samples is named ``correct_name``: a regression's is ``learned``).

    Groups: ``cohort <k>`` for each task k active at the epoch, and ``old`` / ``new`` (the task the
    checkpoint was most recently trained on is new, as in epochlens.evaluation.cohort_table).
    ``sample_task`` (N,) is the task of each sample's class; taking it per sample (not per class)
    lets the samples of several indices, with their own class orders, be pooled. With
    ``sample_group`` (N,) names of each sample's data group (data with a group column), also one
    row per data group, ``group`` ``data: <name>`` and cohort -2.

    Returns:
        DataFrame with columns epoch, group, cohort (-1 for old/new, -2 data groups), n, curvature_mean,
        curvature_q05 … curvature_q95, directional_eig_mean, loss_mean, accuracy.
    """
    _check(epochs, per_epoch)
    task = np.asarray(sample_task)
    rows = []
    for epoch, res in zip(epochs, per_epoch, strict=True):
        curv = np.asarray(res["curvature"], dtype=np.float64)
        active = np.isfinite(np.asarray(res["loss"], dtype=np.float64))
        newest = int(task_at_epoch(epoch, epochs_per_task))
        groups = [(f"cohort {k}", k, active & (task == k)) for k in np.unique(task[active])]
        groups += [("old", -1, active & (task < newest)), ("new", -1, active & (task == newest))]
        if sample_group is not None:
            names = np.asarray(sample_group, dtype=object)
            groups += [(f"data: {g}", -2, active & (names == g)) for g in sorted(set(names[active]))]
        for name, cohort, mask in groups:
            if not mask.any():
                continue
            row = {"epoch": epoch, "group": name, "cohort": int(cohort), "n": int(mask.sum())}
            row["curvature_mean"] = float(curv[mask].mean())
            for q, value in zip(QUANTILES, np.quantile(curv[mask], QUANTILES), strict=True):
                row[f"curvature_q{round(q * 100):02d}"] = float(value)
            row["directional_eig_mean"] = float(np.asarray(res["directional_eig"])[mask].mean())
            row["loss_mean"] = float(np.asarray(res["loss"])[mask].mean())
            row[correct_name] = float(np.asarray(res["correct"])[mask].mean())
            rows.append(row)
    return pd.DataFrame(rows)


def run_tables(
    run: str,
    indices: Sequence[int],
    epochs: Sequence[int],
    folders: Sequence[str | Path],
    class_orders: Sequence[str | Path],
    schedule: Mapping | None,
    epochs_per_task: int,
    sample_group: np.ndarray | None = None,
    correct_name: str = "accuracy",
) -> dict[str, pd.DataFrame]:
    """The curvature tables of one run from its merged epoch folders.

    Args:
        run: the run's name (first column of every table).
        indices: replicate indices, in the order of ``class_orders``.
        epochs: the analysed epochs of each index.
        folders: the merged epoch folders, index-major (``len(indices) * len(epochs)``).
        class_orders: each index's ``class_order.npy``.
        schedule: the config's ``schedule`` section; None for a causal LM (every sample of class 0).
        epochs_per_task: epochs between task boundaries.
        sample_group: (N_train,) each training image's data group name, for data with groups
            (rows ``data: <name>`` in the cohort tables); None: none.
        correct_name: the cohort tables' name for the share of correct samples (``learned`` for a
            regression, whose samples are learned or not, never right or wrong).

    Returns:
        ``samples`` (:func:`sample_dynamics` per index), ``cohorts`` (:func:`cohort_curvature` per
        index), ``distribution`` (the images of every index pooled, for box plots) and ``summary``
        (mean and Student-t 95% interval over indices).
    """
    samples, cohorts, pooled_results, pooled_tasks = [], [], [], []
    for k, (index, class_order) in enumerate(zip(indices, class_orders, strict=True)):
        task_of_class = (
            np.zeros(1, np.int64)  # a causal LM: one class, 0, in task 0 (epochlens.outcome)
            if schedule is None
            else schedule_from_config(schedule, class_order).task_of_class()
        )
        results = [read_epoch(folder)[1] for folder in folders[k * len(epochs) : (k + 1) * len(epochs)]]
        table = sample_dynamics(epochs, results, task_of_class, epochs_per_task)
        samples.append(table.assign(index=index))
        sample_task = task_of_class[results[0]["labels"]]
        cohorts.append(
            cohort_curvature(
                epochs, results, sample_task, epochs_per_task, sample_group, correct_name
            ).assign(index=index)
        )
        pooled_results.append(results)
        pooled_tasks.append(sample_task)
        learned = table["learning_time"].notna().mean()
        log.info("index %s: %d samples, %.0f%% learned by the last epoch", index, len(table), 100 * learned)

    # Distribution over the images of every index together (box plots): concatenate per epoch.
    per_epoch = [
        {key: np.concatenate([res[k][key] for res in pooled_results]) for key in pooled_results[0][k]}
        for k in range(len(epochs))
    ]
    pooled_groups = None if sample_group is None else np.concatenate([sample_group] * len(indices))
    pooled = cohort_curvature(
        epochs, per_epoch, np.concatenate(pooled_tasks), epochs_per_task, pooled_groups, correct_name
    )

    def first(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
        df.insert(0, "run", run)
        return df[["run", *cols, *[c for c in df.columns if c not in ("run", *cols)]]]

    tables = {
        "samples": first(pd.concat(samples, ignore_index=True), "index", "sample"),
        "cohorts": first(pd.concat(cohorts, ignore_index=True), "index", "epoch"),
        "distribution": first(pooled, "epoch"),
    }
    metrics = ["n", "curvature_mean", "curvature_q50", "loss_mean", correct_name]
    tables["summary"] = over_replicates(tables["cohorts"], ["run", "epoch", "group", "cohort"], metrics)
    return tables
