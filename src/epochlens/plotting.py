"""Figures drawn from the tidy tables (never from raw results), as PNG and PDF."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from epochlens.atomic import atomic_path  # noqa: E402


def save_figure(fig: plt.Figure, paths: list[str | Path]) -> None:
    """Save ``fig`` to each path (format from the suffix), atomically, then close it."""
    for path in paths:
        path = Path(path)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lstrip("."), dpi=150, bbox_inches="tight")
    plt.close(fig)


def _mean_ci(values: pd.Series) -> tuple[float, float]:
    """Mean and half-width of a Student-t 95% interval across replicates (few seeds: t, not 1.96)."""
    v = values.to_numpy(dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    t = stats.t.ppf(0.975, df=len(v) - 1)
    return float(v.mean()), float(t * v.std(ddof=1) / np.sqrt(len(v)))


def plot_accuracy_by_cohort(
    cohorts: pd.DataFrame, epochs_per_task: int, title: str, split: str = "test"
) -> plt.Figure:
    """Two panels: accuracy of each task cohort over checkpoints, and old vs new classes.

    ``cohorts`` is the output of :func:`epochlens.evaluation.cohort_table`; with several replicate
    indices the line is their mean and the band a 95% interval.
    """
    df = cohorts[cohorts["split"] == split]
    fig, (ax_cohort, ax_age) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    cohort_ids = sorted(c for c in df["cohort"].unique() if c >= 0)
    cmap = plt.get_cmap("viridis", max(len(cohort_ids), 2))
    for k, cohort in enumerate(cohort_ids):
        sub = df[df["cohort"] == cohort]
        _line(ax_cohort, sub, color=cmap(k), label=f"task {cohort}")
    ax_cohort.set_title("accuracy of each task's classes")
    ax_cohort.legend(fontsize=7, ncol=2 if len(cohort_ids) > 6 else 1, title="introduced in")
    for group, color in (("new", "tab:orange"), ("old", "tab:blue")):
        _line(ax_age, df[df["group"] == group], color=color, label=f"{group} classes")
    ax_age.set_title("newest task vs earlier tasks")
    ax_age.legend(fontsize=8)
    for ax in (ax_cohort, ax_age):
        ax.set_xlabel("checkpoint epoch")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        for boundary in range(0, int(df["epoch"].max()) + 1, epochs_per_task):
            ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)
    ax_cohort.set_ylabel(f"{split} accuracy")
    n_idx = df["index"].nunique()
    suffix = f" (mean and 95% CI over {n_idx} seeds)" if n_idx > 1 else ""
    fig.suptitle(f"{title}: class-incremental accuracy{suffix}")
    fig.tight_layout()
    return fig


def _line(ax: plt.Axes, sub: pd.DataFrame, color, label: str) -> None:
    if sub.empty:
        return
    stats = sub.groupby("epoch")["accuracy"].apply(_mean_ci)
    epochs = stats.index.to_numpy()
    mean = np.array([m for m, _ in stats])
    half = np.array([h for _, h in stats])
    ax.plot(epochs, mean, marker="o", ms=3, color=color, label=label)
    if np.any(half > 0):
        ax.fill_between(epochs, mean - half, mean + half, color=color, alpha=0.2)


def plot_training_curves(logs: pd.DataFrame, epochs_per_task: int, title: str) -> plt.Figure:
    """Training loss and holdout accuracy per epoch, one line per replicate index.

    ``logs`` concatenates the per-index training logs with an ``index`` column. Task boundaries are
    marked: the loss jumps and holdout accuracy drops when a task's new classes arrive.
    """
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    cmap = plt.get_cmap("tab10")
    for k, (index, log) in enumerate(logs.groupby("index")):
        ax_loss.plot(log["epoch"], log["train_loss"], color=cmap(k % 10), label=f"index {index}")
        ax_acc.plot(log["epoch"], log["holdout_accuracy"], color=cmap(k % 10), label=f"index {index}")
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        for boundary in range(0, int(logs["epoch"].max()) + 1, epochs_per_task):
            ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)
        ax.legend(fontsize=8)
    ax_loss.set_ylabel("training loss (active classes)")
    ax_loss.set_yscale("log")
    ax_acc.set_ylabel("holdout accuracy (active classes)")
    ax_acc.set_ylim(-0.02, 1.02)
    fig.suptitle(f"{title}: class-incremental training")
    fig.tight_layout()
    return fig
