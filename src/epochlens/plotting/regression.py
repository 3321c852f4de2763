"""A regression run's errors over checkpoints: MSE and R² on the test split and the holdout."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from epochlens.plotting.common import replicate_line, replicates_note, step_epoch_axis

#: What each panel shows: (column, axis label, log scale).
PANELS = (("mse", "mean squared error", True), ("r2", "R²", False))


def plot_regression_metrics(metrics: pd.DataFrame, title: str) -> plt.Figure:
    """MSE (log scale) and R² over checkpoints, one line per split (and per data group of the test
    split, for data with groups), the mean over replicate indices with a 95% band from 3 seeds on.

    ``metrics``: a run's ``tables/regression_metrics.csv`` (one row per index, epoch, split and
    data group; :data:`epochlens.evaluation.REGRESSION_COLUMNS`).
    """
    groups = sorted(g for g in metrics["data_group"].astype(str).unique() if g != "all")
    lines = [("test", "all", "tab:blue"), ("holdout", "all", "tab:orange")]
    palette = plt.get_cmap("tab10")
    lines += [("test", g, palette((k + 2) % 10)) for k, g in enumerate(groups)]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.5 * len(PANELS), 4.2), squeeze=False)
    steps = "train_epoch" in metrics.columns
    for ax, (column, label, log) in zip(axes[0], PANELS, strict=True):
        for split, group, color in lines:
            sub = metrics[(metrics["split"] == split) & (metrics["data_group"].astype(str) == group)]
            name = split if group == "all" else f"test: {group}"
            replicate_line(ax, sub, color=color, label=name, column=column)
        ax.set_ylabel(label)
        ax.set_xlabel("checkpoint step" if steps else "checkpoint epoch")
        if log and (metrics[column] > 0).all():
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if steps:
            step_epoch_axis(ax, metrics[["epoch", "train_epoch"]].drop_duplicates())
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: regression errors{replicates_note(metrics['index'].nunique())}")
    fig.tight_layout()
    return fig
