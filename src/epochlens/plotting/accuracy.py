"""Accuracy of each task cohort over checkpoints, and the training curves."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from epochlens.plotting.common import replicate_line, replicates_note


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
        replicate_line(ax_cohort, sub, color=cmap(k), label=f"task {cohort}")
    ax_cohort.set_title("accuracy of each task's classes")
    ax_cohort.legend(fontsize=7, ncol=2 if len(cohort_ids) > 6 else 1, title="introduced in")
    for group, color in (("new", "tab:orange"), ("old", "tab:blue")):
        replicate_line(ax_age, df[df["group"] == group], color=color, label=f"{group} classes")
    ax_age.set_title("newest task vs earlier tasks")
    ax_age.legend(fontsize=8)
    for ax in (ax_cohort, ax_age):
        ax.set_xlabel("checkpoint epoch")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        for boundary in range(0, int(df["epoch"].max()) + 1, epochs_per_task):
            ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)
    ax_cohort.set_ylabel(f"{split} accuracy")
    fig.suptitle(f"{title}: class-incremental accuracy{replicates_note(df['index'].nunique())}")
    fig.tight_layout()
    return fig


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
