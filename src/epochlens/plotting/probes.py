"""Probe score heatmaps (layer x epoch) per target and representation: accuracy of the softmax
probes, R² of a regression's ridge probe (each panel names its metric, one colour bar per metric)."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.plotting.common import heatmap_panel

#: How each metric is drawn: colour map, and its name in titles and on its colour bar.
METRIC_STYLE = {"accuracy": ("viridis", "accuracy"), "r2": ("plasma", "R²")}


def _target_label(target: str) -> str:
    if target == "class":
        return "class (among the active classes)"
    if target == "cohort":
        return "old vs new classes"
    if target.startswith("curvature_q"):
        return f"curvature quantile bin ({target.removeprefix('curvature_q')} bins)"
    if target == "target":
        return "regression target (ridge probe)"
    if target.startswith("target_q"):
        return f"target quantile bin ({target.removeprefix('target_q')} bins; vector: of its L2 norm)"
    return target


def _metric_of(summary: pd.DataFrame, target: str) -> str:
    """The metric of a target's rows (a table without a metric column holds accuracies)."""
    if "metric" not in summary.columns:
        return "accuracy"
    found = summary.loc[summary["target"] == target, "metric"].dropna().unique()
    if len(found) > 1:
        raise ValueError(f"probe target {target!r} has rows of several metrics {list(found)}")
    return str(found[0]) if len(found) else "accuracy"


#: Beyond this many layers the heatmaps put the layers along x and a row per epoch.
MANY_LAYERS = 24


def _panel_matrix(sub: pd.DataFrame, value: str, layers: list, epochs: list[int], wide: bool) -> np.ndarray:
    """One panel's cells: a chance row, then layers x epochs, or (``wide``) epochs x layers with
    chance the same along each row's layers."""
    score = sub.pivot_table(index="layer", columns="epoch", values=value, aggfunc="mean")
    score = score.reindex(index=layers, columns=epochs).to_numpy(float)
    chance = sub.groupby("epoch")["chance"].mean().reindex(epochs).to_numpy(float)
    if wide:
        return np.vstack(
            [np.full((1, len(layers)), np.nanmean(chance) if np.isfinite(chance).any() else np.nan), score.T]
        )
    return np.vstack([chance[None, :], score])


def _thin_layer_ticks(ax: plt.Axes, layers: list) -> None:
    """About 32 layer labels along x, so that 128 stay readable."""
    step = max(1, int(np.ceil(len(layers) / 32)))
    ticks = list(range(0, len(layers), step))
    ax.set_xticks(ticks, [str(layers[t]) for t in ticks], rotation=90, fontsize=6)


def plot_probe_accuracy(summary: pd.DataFrame, title: str, split: str = "holdout") -> plt.Figure:
    """Heatmaps of linear-probe scores, layer x epoch: one column of panels per target, one row
    per representation, with the score of the constant guess (``chance``) as a top row. Beyond
    :data:`MANY_LAYERS` layers (e.g. 128 stored layers) each panel has the layers along x (every
    few labelled) and a row per epoch, so the figure stays a page high.

    ``summary`` is :func:`epochlens.probes.summary.probe_summary`; cells are ``accuracy_mean``, or
    ``r2_mean`` for a target whose ``metric`` is r2 (a regression's ridge probe; its panels come
    first, R² below 0 takes the lowest colour, the number is written), on the ``split`` evaluation
    samples (the test split if there is no holdout). Each panel's title names its metric; one
    colour bar per metric. Grey cells: the target was skipped at that epoch (no old classes yet,
    no curvature computed) or not evaluated there.
    """
    ok = summary[summary["status"] == "ok"]
    if split not in set(ok["eval_split"]):
        split = "test"
    ok = ok[ok["eval_split"] == split]
    targets = list(pd.unique(summary["target"]))
    metrics = {t: _metric_of(summary, t) for t in targets}
    targets.sort(key=lambda t: metrics[t] != "r2")  # R² panels first, each metric's side by side
    reps = list(pd.unique(summary["representation"]))
    layers = list(pd.unique(summary["layer"]))
    epochs = sorted(int(e) for e in summary["epoch"].unique())
    wide = len(layers) > MANY_LAYERS  # layers along x, a row per epoch (e.g. 128 layers)
    rows = ["chance", *([f"epoch {e}" for e in epochs] if wide else layers)]
    columns = layers if wide else epochs
    annotate = len(columns) <= 12 and len(rows) <= 14
    if wide:
        width, height = min(max(0.09 * len(layers) + 2.0, 6.0), 16.0), 0.3 * len(rows) + 1.1
    else:
        width, height = min(max(0.5 * len(epochs) + 1.6, 3.4), 9.0), 0.32 * len(rows) + 1.0
    fig, axes = plt.subplots(
        len(reps),
        len(targets),
        figsize=(width * len(targets) + 1.0 * len(set(metrics.values())), height * len(reps) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    norm = matplotlib.colors.Normalize(0.0, 1.0)
    images: dict[str, list] = {}
    for j, target in enumerate(targets):
        metric = metrics[target]
        cmap, metric_name = METRIC_STYLE.get(metric, ("viridis", metric))
        for i, rep in enumerate(reps):
            sub = ok[(ok["representation"] == rep) & (ok["target"] == target)]
            matrix = _panel_matrix(sub, f"{metric}_mean", layers, epochs, wide)
            ax = axes[i, j]
            image = heatmap_panel(ax, matrix, rows, columns, cmap, norm, "{:.2f}", annotate, j == 0)
            if wide:
                _thin_layer_ticks(ax, layers)
            images.setdefault(metric, [image, []])[1].append(ax)
            ax.axhline(0.5, color="w", lw=2)
            if i == 0:
                ax.set_title(f"{_target_label(target)}\n{split} {metric_name}", fontsize=9)
            if j == 0:
                ax.set_ylabel(rep, fontsize=9)
            if i == len(reps) - 1:
                ax.set_xlabel("layer" if wide else "checkpoint epoch", fontsize=8)
    for metric, (image, metric_axes) in images.items():
        label = METRIC_STYLE.get(metric, (None, metric))[1]
        fig.colorbar(image, ax=metric_axes, shrink=0.8, label=f"{split} {label}")
    n_idx = int(ok["n_indices"].max()) if len(ok) else 0
    n_seeds = int(ok["n_seeds"].max()) if len(ok) else 0
    ridge = "r2" in metrics.values()
    what = "scores (R² of the ridge probe, else accuracy)" if ridge else "accuracy"
    fig.suptitle(
        f"{title}: linear-probe {what} per layer\n({split} samples; mean of {n_idx} index(es) x "
        f"{n_seeds} probe seed(s); grey: target skipped)",
        fontsize=10,
    )
    return fig
