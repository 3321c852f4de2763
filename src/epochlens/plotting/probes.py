"""Probe scores per layer, target and representation (heatmaps layer x epoch; past 24 layers, a
line per representation): accuracy of the softmax probes, R² of a regression's ridge probe (each
panel names its metric)."""

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


#: Beyond this many layers the figure draws lines (score against layer), not heatmaps.
MANY_LAYERS = 24


def _panel_matrix(sub: pd.DataFrame, value: str, layers: list, epochs: list[int]) -> np.ndarray:
    """One heatmap panel's cells: a chance row, then layers x epochs."""
    score = sub.pivot_table(index="layer", columns="epoch", values=value, aggfunc="mean")
    score = score.reindex(index=layers, columns=epochs).to_numpy(float)
    chance = sub.groupby("epoch")["chance"].mean().reindex(epochs).to_numpy(float)
    return np.vstack([chance[None, :], score])


def _thin_layer_ticks(ax: plt.Axes, layers: list) -> None:
    """About 32 layer labels along x, so that 128 stay readable."""
    step = max(1, int(np.ceil(len(layers) / 32)))
    ticks = list(range(0, len(layers), step))
    ax.set_xticks(ticks, [str(layers[t]) for t in ticks], rotation=90, fontsize=6)


def plot_probe_accuracy(summary: pd.DataFrame, title: str, split: str = "holdout") -> plt.Figure:
    """Linear-probe scores per layer, of the targets that apply to the run (a target skipped at
    every epoch, e.g. old vs new classes without a schedule, is named in the title, not drawn).

    Up to :data:`MANY_LAYERS` layers: heatmaps layer x epoch, one column of panels per target, one
    row per representation, the score of the constant guess (``chance``) as a top row. More
    layers (e.g. 128 stored ones): a panel per target and epoch with a line per representation,
    score against layer, with its interval (:func:`_line_figure`).

    ``summary`` is :func:`epochlens.probes.summary.probe_summary`; the score is ``accuracy_mean``,
    or ``r2_mean`` for a target whose ``metric`` is r2 (a regression's ridge probe; its panels come
    first), on the ``split`` evaluation samples (the test split if there is no holdout).
    """
    ok = summary[summary["status"] == "ok"]
    if split not in set(ok["eval_split"]):
        split = "test"
    ok = ok[ok["eval_split"] == split]
    every = list(pd.unique(summary["target"]))
    targets = [t for t in every if (ok["target"] == t).any()] or every
    metrics = {t: _metric_of(summary, t) for t in targets}
    targets.sort(key=lambda t: metrics[t] != "r2")  # R² panels first, each metric's side by side
    layers = list(pd.unique(summary["layer"]))
    lines = len(layers) > MANY_LAYERS
    fig = (_line_figure if lines else _heatmap_figure)(ok, targets, metrics, layers, split)
    skipped = [_target_label(t) for t in every if t not in targets]
    n_idx = int(ok["n_indices"].max()) if len(ok) else 0
    n_seeds = int(ok["n_seeds"].max()) if len(ok) else 0
    what = "scores (R² of the ridge probe, else accuracy)" if "r2" in metrics.values() else "accuracy"
    fig.suptitle(
        f"{title}: linear-probe {what} per layer\n({split} samples; mean of {n_idx} index(es) x "
        f"{n_seeds} probe seed(s)"
        + ("" if lines else "; grey: target skipped")
        + (f"; not shown, skipped at every epoch: {', '.join(skipped)}" if skipped else "")
        + ")",
        fontsize=10,
    )
    return fig


def _heatmap_figure(ok: pd.DataFrame, targets: list, metrics: dict, layers: list, split: str) -> plt.Figure:
    """Heatmaps layer x epoch: a column of panels per target, a row per representation."""
    reps = list(pd.unique(ok["representation"])) or ["-"]
    epochs = sorted(int(e) for e in ok["epoch"].unique())
    rows = ["chance", *layers]
    annotate = len(epochs) <= 12 and len(rows) <= 14
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
            matrix = _panel_matrix(sub, f"{metric}_mean", layers, epochs)
            ax = axes[i, j]
            image = heatmap_panel(ax, matrix, rows, epochs, cmap, norm, "{:.2f}", annotate, j == 0)
            images.setdefault(metric, [image, []])[1].append(ax)
            ax.axhline(0.5, color="w", lw=2)
            if i == 0:
                ax.set_title(f"{_target_label(target)}\n{split} {metric_name}", fontsize=9)
            if j == 0:
                ax.set_ylabel(rep, fontsize=9)
            if i == len(reps) - 1:
                ax.set_xlabel("checkpoint epoch", fontsize=8)
    for metric, (image, metric_axes) in images.items():
        label = METRIC_STYLE.get(metric, (None, metric))[1]
        fig.colorbar(image, ax=metric_axes, shrink=0.8, label=f"{split} {label}")
    return fig


def _line_figure(ok: pd.DataFrame, targets: list, metrics: dict, layers: list, split: str) -> plt.Figure:
    """Score against layer: a panel per target (columns) and epoch (rows), a line per
    representation with its band (:func:`_interval`), the constant guess dashed."""
    reps = list(pd.unique(ok["representation"]))
    epochs = sorted(int(e) for e in ok["epoch"].unique()) or [0]
    colors = dict(zip(reps, plt.get_cmap("tab10" if len(reps) <= 10 else "tab20").colors, strict=False))
    fig, axes = plt.subplots(
        len(epochs),
        len(targets),
        figsize=(min(0.05 * len(layers) + 4.0, 9.0) * len(targets) + 1.6, 2.4 * len(epochs) + 1.0),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    x = np.arange(len(layers))
    for j, target in enumerate(targets):
        metric = metrics[target]
        for i, epoch in enumerate(epochs):
            ax = axes[i, j]
            sub = ok[(ok["target"] == target) & (ok["epoch"] == epoch)]
            for rep in reps:
                rows = sub[sub["representation"] == rep].groupby("layer").mean(numeric_only=True)
                rows = rows.reindex(layers)
                mean, lo, hi = _interval(rows, metric)
                ax.plot(x, mean, color=colors[rep], lw=1.2, label=rep)
                ax.fill_between(x, lo, hi, color=colors[rep], alpha=0.2, lw=0)
            chance = sub.groupby("layer")["chance"].mean().reindex(layers).to_numpy(float)
            ax.plot(x, chance, color="0.4", ls="--", lw=0.8, label="constant guess")
            if metric == "accuracy":
                ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"{_target_label(target)}, epoch {epoch}", fontsize=9)
            ax.set_ylabel(f"{split} {METRIC_STYLE.get(metric, (None, metric))[1]}", fontsize=8)
            ax.tick_params(labelsize=7)
        _thin_layer_ticks(axes[-1, j], layers)
        axes[-1, j].set_xlabel("layer", fontsize=8)
    axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="representation")
    n_idx = int(ok["n_indices"].max()) if len(ok) else 0
    band = "95% CI over indices" if n_idx > 1 else "mean ± 1 sd over probe seeds"
    fig.text(0.0, 0.0, f"bands: {band}, clipped to the metric's range", fontsize=7, color="0.3")
    return fig


def _interval(rows: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and band of a metric per layer: the 95% CI over indices where there are several,
    else ±1 sd over probe seeds; an accuracy's band clipped to [0, 1], an R²'s to at most 1."""
    mean = rows[f"{metric}_mean"].to_numpy(float)
    ci = rows.get(f"{metric}_ci95", pd.Series(np.nan, index=rows.index)).to_numpy(float)
    sd = rows.get(f"{metric}_seed_std", pd.Series(0.0, index=rows.index)).to_numpy(float)
    half = np.where(np.isfinite(ci), ci, np.nan_to_num(sd))
    low = 0.0 if metric == "accuracy" else -np.inf
    return mean, np.clip(mean - half, low, 1.0), np.clip(mean + half, low, 1.0)
