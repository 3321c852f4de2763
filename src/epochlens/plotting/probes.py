"""Probe accuracy heatmaps (layer x epoch) per target and representation."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.plotting.common import heatmap_panel


def _target_label(target: str) -> str:
    if target == "class":
        return "class (among the active classes)"
    if target == "cohort":
        return "old vs new classes"
    if target.startswith("curvature_q"):
        return f"curvature quantile bin ({target.removeprefix('curvature_q')} bins)"
    return target


def plot_probe_accuracy(summary: pd.DataFrame, title: str, split: str = "holdout") -> plt.Figure:
    """Heatmaps of linear-probe accuracy, layer x epoch: one column of panels per target, one row
    per representation, with the accuracy of always guessing the commonest class as a top row.

    ``summary`` is :func:`epochlens.probes.summary.probe_summary`; cells are ``accuracy_mean`` on the
    ``split`` evaluation images (the test split if there is no holdout). Grey cells: the target
    was skipped at that epoch (no old classes yet, no curvature computed) or not evaluated there.
    """
    ok = summary[summary["status"] == "ok"]
    if split not in set(ok["eval_split"]):
        split = "test"
    ok = ok[ok["eval_split"] == split]
    targets = list(pd.unique(summary["target"]))
    reps = list(pd.unique(summary["representation"]))
    layers = list(pd.unique(summary["layer"]))
    epochs = sorted(int(e) for e in summary["epoch"].unique())
    rows = ["chance", *layers]
    annotate = len(epochs) <= 12 and len(rows) <= 14
    width = min(max(0.5 * len(epochs) + 1.6, 3.4), 9.0)
    height = 0.32 * len(rows) + 1.0
    fig, axes = plt.subplots(
        len(reps),
        len(targets),
        figsize=(width * len(targets) + 1.0, height * len(reps) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    norm = matplotlib.colors.Normalize(0.0, 1.0)
    image = None
    for i, rep in enumerate(reps):
        for j, target in enumerate(targets):
            sub = ok[(ok["representation"] == rep) & (ok["target"] == target)]
            acc = sub.pivot_table(index="layer", columns="epoch", values="accuracy_mean", aggfunc="mean")
            acc = acc.reindex(index=layers, columns=epochs)
            chance = sub.groupby("epoch")["chance"].mean().reindex(epochs)
            matrix = np.vstack([chance.to_numpy(float)[None, :], acc.to_numpy(float)])
            ax = axes[i, j]
            image = heatmap_panel(ax, matrix, rows, epochs, "viridis", norm, "{:.2f}", annotate, j == 0)
            ax.axhline(0.5, color="w", lw=2)
            if i == 0:
                ax.set_title(_target_label(target), fontsize=9)
            if j == 0:
                ax.set_ylabel(rep, fontsize=9)
            if i == len(reps) - 1:
                ax.set_xlabel("checkpoint epoch", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label=f"{split} accuracy")
    n_idx = int(ok["n_indices"].max()) if len(ok) else 0
    n_seeds = int(ok["n_seeds"].max()) if len(ok) else 0
    fig.suptitle(
        f"{title}: linear-probe accuracy per layer ({split} images; mean of {n_idx} index(es) x "
        f"{n_seeds} probe seed(s); grey: target skipped)",
        fontsize=10,
    )
    return fig
