"""Curvature figures: by cohort over epochs, its distribution, and against loss / CSL."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.plotting.common import (
    cohort_colors,
    replicate_line,
    replicates_note,
    step_epoch_axis,
    task_boundaries,
)
from epochlens.stats import spearman


def plot_curvature_by_cohort(cohorts: pd.DataFrame, epochs_per_task: int, title: str) -> plt.Figure:
    """Mean curvature of each task cohort over checkpoints, of old vs new classes and, for data
    with groups (rows ``data: <name>``, cohort -2), of each data group.

    ``cohorts`` is :func:`epochlens.curvature.dynamics.cohort_curvature` per index with an ``index``
    column; lines are means over indices with a Student-t 95% band.
    """
    data_groups = cohorts[cohorts["cohort"] == -2]
    n_panels = 3 if len(data_groups) else 2
    fig, axes = plt.subplots(1, n_panels, figsize=(5.5 * n_panels, 4.2), sharey=True)
    ax_cohort, ax_age = axes[0], axes[1]
    by_cohort = cohorts[cohorts["cohort"] >= 0]
    colors = cohort_colors(by_cohort["cohort"].unique())
    for cohort, color in colors.items():
        sub = by_cohort[by_cohort["cohort"] == cohort]
        replicate_line(ax_cohort, sub, color, f"task {cohort}", column="curvature_mean")
    ax_cohort.set_title("each task's training samples")
    ax_cohort.legend(fontsize=7, ncol=2 if len(colors) > 6 else 1, title="introduced in")
    for group, color in (("new", "tab:orange"), ("old", "tab:blue")):
        sub = cohorts[cohorts["group"] == group]
        replicate_line(ax_age, sub, color, f"{group} classes", "curvature_mean")
    ax_age.set_title("newest task vs earlier tasks")
    ax_age.legend(fontsize=8)
    if len(data_groups):
        palette = plt.get_cmap("tab10")
        for k, name in enumerate(sorted(data_groups["group"].unique())):
            sub = data_groups[data_groups["group"] == name]
            replicate_line(axes[2], sub, palette(k % 10), name.removeprefix("data: "), "curvature_mean")
        axes[2].set_title("each data group")
        axes[2].legend(fontsize=8, title="group")
    steps = "train_epoch" in cohorts.columns  # a Trainer folder's checkpoints: steps
    for ax in axes:
        ax.set_xlabel("checkpoint step" if steps else "checkpoint epoch")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        task_boundaries(ax, cohorts["epoch"].max(), epochs_per_task)
        if steps:
            step_epoch_axis(ax, cohorts[["epoch", "train_epoch"]].drop_duplicates())
    ax_cohort.set_ylabel("mean input-loss curvature")
    note = replicates_note(cohorts["index"].nunique())
    fig.suptitle(f"{title}: per-sample curvature by task cohort{note}")
    fig.tight_layout()
    return fig


def plot_curvature_distribution(pooled: pd.DataFrame, title: str, max_panels: int = 6) -> plt.Figure:
    """Box plots of per-sample curvature by task cohort at up to ``max_panels`` checkpoints.

    ``pooled`` is :func:`epochlens.curvature.dynamics.cohort_curvature` over the samples of every
    index together: boxes span the quartiles, whiskers the 5% and 95% quantiles, a line the median.
    The epochs shown are spread evenly over the analysed ones, always with the first and last.
    """
    by_cohort = pooled[pooled["cohort"] >= 0]
    epochs = sorted(by_cohort["epoch"].unique())
    picks = sorted({epochs[round(k)] for k in np.linspace(0, len(epochs) - 1, min(max_panels, len(epochs)))})
    colors = cohort_colors(by_cohort["cohort"].unique())
    ncols = min(3, len(picks))
    nrows = -(-len(picks) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), sharey=True, squeeze=False)
    for ax, epoch in zip(axes.flat, picks, strict=False):
        sub = by_cohort[by_cohort["epoch"] == epoch].sort_values("cohort")
        boxes = [
            {
                "med": r.curvature_q50,
                "q1": r.curvature_q25,
                "q3": r.curvature_q75,
                "whislo": r.curvature_q05,
                "whishi": r.curvature_q95,
                "mean": r.curvature_mean,
                "label": str(r.cohort),
                "fliers": [],
            }
            for r in sub.itertuples()
        ]
        art = ax.bxp(boxes, showmeans=True, showfliers=False, patch_artist=True, widths=0.6)
        for patch, cohort in zip(art["boxes"], sub["cohort"], strict=True):
            patch.set_facecolor(colors[int(cohort)])
            patch.set_alpha(0.6)
        ax.set_title(f"epoch {epoch} (n={int(sub['n'].sum())})", fontsize=9)
        ax.set_xlabel("task cohort")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
        if len(boxes) > 10:  # many cohorts (e.g. 20 CIFAR-100 tasks): label every other one
            for k, label in enumerate(ax.get_xticklabels()):
                label.set_visible(k % 2 == 0)
    for ax in axes.flat[len(picks) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("per-sample curvature")
    fig.suptitle(f"{title}: curvature distribution by cohort (box 25-75%, whiskers 5-95%, ▲ mean)")
    fig.tight_layout()
    return fig


def plot_curvature_vs_loss(samples: pd.DataFrame, title: str) -> plt.Figure:
    """Per-sample curvature against loss (last analysed epoch), CSL and learning time.

    ``samples`` is :func:`epochlens.curvature.dynamics.sample_dynamics` of every index, concatenated.
    Log-log scatter coloured by task cohort, Spearman's rho over all points in each title.
    """
    seen = samples[samples["n_epochs"] > 0]
    colors = cohort_colors(seen["task"].unique())
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    panels = (
        ("loss_final", "curvature_final", "loss at the last analysed epoch", "curvature (last epoch)"),
        ("csl_mean", "curvature_mean", "CSL per analysed epoch (csl_mean)", "mean curvature over epochs"),
        ("epochs_to_learn", "curvature_mean", "epochs to learn (learning time - start of its task)", ""),
    )
    for ax, (x, y, xlabel, ylabel) in zip(axes, panels, strict=True):
        log_x = x != "epochs_to_learn"  # learning time: linear, 0 included
        ok = seen[((seen[x] > 0) if log_x else seen[x].notna()) & (seen[y] > 0)]
        ax.scatter(
            ok[x], ok[y], c=[colors[int(t)] for t in ok["task"]], s=4, alpha=0.5, lw=0, rasterized=True
        )
        rho = spearman(ok[x], ok[y])
        ax.set_title(f"Spearman rho = {rho:.2f} (n={len(ok)})", fontsize=9)
        ax.set_xscale("log" if log_x else "linear")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel or axes[1].get_ylabel())
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=f"task {t}") for t, c in colors.items()]
    axes[-1].legend(handles=handles, fontsize=7, ncol=2 if len(handles) > 6 else 1, title="cohort")
    n_idx = samples["index"].nunique() if "index" in samples else 1
    fig.suptitle(
        f"{title}: curvature vs loss, cumulative sample loss and learning time ({n_idx} seeds pooled; "
        "samples never learned are left out of the right panel)"
    )
    fig.tight_layout()
    return fig
