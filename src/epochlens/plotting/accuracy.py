"""Accuracy of each task cohort over checkpoints, and the training curves."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from epochlens.plotting.common import replicate_line, replicates_note, step_epoch_axis


def plot_accuracy_by_cohort(
    cohorts: pd.DataFrame,
    epochs_per_task: int,
    title: str,
    split: str = "test",
    groups: pd.DataFrame | None = None,
    metric: str = "accuracy",
) -> plt.Figure:
    """Accuracy of each task cohort over checkpoints, old vs new classes, and, for data with
    groups (``groups``: :func:`epochlens.evaluation.group_table`, with rows), each data group.

    ``cohorts`` is the output of :func:`epochlens.evaluation.cohort_table`; with several replicate
    indices the line is their mean and the band a 95% interval. A run with one task (every class
    from the start) gets one panel of all its samples instead of the cohort panels. Checkpoints
    numbered by step (a Trainer folder: the tables have ``train_epoch``) get the training epoch as
    a second axis. ``metric`` names the accuracy (a causal LM's is exact match).
    """
    df = cohorts[cohorts["split"] == split]
    by_group = groups is not None and len(groups[groups["split"] == split]) > 0
    cohort_ids = sorted(c for c in df["cohort"].unique() if c >= 0)
    incremental = len(cohort_ids) > 1
    n_panels = (2 if incremental else 1) + int(by_group)
    fig, axes = plt.subplots(1, n_panels, figsize=(5.5 * n_panels, 4.2), sharey=True, squeeze=False)
    axes = list(axes[0])
    if incremental:
        ax_cohort, ax_age = axes[0], axes[1]
        cmap = plt.get_cmap("viridis", len(cohort_ids))
        for k, cohort in enumerate(cohort_ids):
            sub = df[df["cohort"] == cohort]
            replicate_line(ax_cohort, sub, color=cmap(k), label=f"task {cohort}")
        ax_cohort.set_title("accuracy of each task's classes")
        ax_cohort.legend(fontsize=7, ncol=2 if len(cohort_ids) > 6 else 1, title="introduced in")
        for group, color in (("new", "tab:orange"), ("old", "tab:blue")):
            replicate_line(ax_age, df[df["group"] == group], color=color, label=f"{group} classes")
        ax_age.set_title("newest task vs earlier tasks")
        ax_age.legend(fontsize=8)
    else:
        replicate_line(axes[0], df[df["cohort"] == cohort_ids[0]], color="tab:orange", label="all")
        axes[0].set_title("all samples")
    if by_group:
        sub = groups[groups["split"] == split]
        palette = plt.get_cmap("tab10")
        for k, name in enumerate(sorted(sub["data_group"].astype(str).unique())):
            replicate_line(
                axes[-1], sub[sub["data_group"].astype(str) == name], color=palette(k % 10), label=name
            )
        axes[-1].set_title("each data group")
        axes[-1].legend(fontsize=8, title="group")
    steps = "train_epoch" in df.columns
    for ax in axes:
        ax.set_xlabel("checkpoint step" if steps else "checkpoint epoch")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if incremental:
            for boundary in range(0, int(df["epoch"].max()) + 1, epochs_per_task):
                ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)
        if steps:
            step_epoch_axis(ax, df[["epoch", "train_epoch"]].drop_duplicates())
    axes[0].set_ylabel(f"{split} {metric}")
    kind = f"class-incremental {metric}" if incremental else metric
    fig.suptitle(f"{title}: {kind}{replicates_note(df['index'].nunique())}")
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
    one_task = logs["task"].nunique() == 1 if "task" in logs else False
    fig.suptitle(f"{title}: {'training' if one_task else 'class-incremental training'}")
    fig.tight_layout()
    return fig
