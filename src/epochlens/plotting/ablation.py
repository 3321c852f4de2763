"""Ablation effect heatmaps (unit group x epoch) on old and new classes."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.plotting.common import heatmap_panel


def plot_ablation_effect(
    summary: pd.DataFrame, title: str, metric: str = "delta_accuracy", loss_unit: str = "nats"
) -> plt.Figure:
    """Heatmaps of the effect of ablating each unit group, unit group x epoch, on the old and the
    new classes (columns of panels; a regression's: all samples) for each ablation mode (rows of
    panels). ``loss_unit`` names the loss's unit (a regression's: squared error).

    ``summary`` is :func:`epochlens.ablation.summary.ablation_summary`; cells are ``{metric}_mean``
    (ablated minus intact; red: the ablation hurts accuracy). The colour scale is symmetric and
    saturates at the 98th percentile of the absolute effects of the channel groups (of the whole
    blocks where there are no groups), so that the small channel-group effects stay visible next to
    whole-block ablations, which mostly saturate; written values are in percentage points.
    """
    cohorts = [c for c in ("old", "new") if c in set(summary["cohort"])] or ["all"]  # a regression: all
    modes = list(pd.unique(summary["mode"]))
    groups = list(dict.fromkeys(zip(summary["block"], summary["group"], strict=True)))
    rows = [f"{block} {group}" for block, group in groups]
    epochs = sorted(int(e) for e in summary["epoch"].unique())
    column = f"{metric}_mean"
    shown = summary[summary["cohort"].isin(cohorts)]
    if (shown["group"] != "all").any():
        shown = shown[shown["group"] != "all"]
    values = shown[column].abs().dropna()
    vlim = max(float(np.percentile(values, 98)) if len(values) else 0.0, 0.02)
    norm = matplotlib.colors.Normalize(-vlim, vlim)
    cmap = "RdBu" if "accuracy" in metric else "RdBu_r"  # red: worse
    annotate = len(epochs) <= 12 and len(rows) <= 24
    width = min(max(0.45 * len(epochs) + 2.0, 3.6), 9.0)
    height = 0.26 * len(rows) + 1.0
    fig, axes = plt.subplots(
        len(modes),
        len(cohorts),
        figsize=(width * len(cohorts) + 1.2, height * len(modes) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    image = None
    block_ends = [k for k in range(1, len(groups)) if groups[k][0] != groups[k - 1][0]]
    for i, mode in enumerate(modes):
        for j, cohort in enumerate(cohorts):
            sub = summary[(summary["mode"] == mode) & (summary["cohort"] == cohort)]
            table = sub.pivot_table(index=["block", "group"], columns="epoch", values=column, aggfunc="mean")
            table = table.reindex(index=pd.MultiIndex.from_tuples(groups), columns=epochs)
            matrix = table.to_numpy(float)
            ax = axes[i, j]
            scale = 100.0 if "accuracy" in metric else 1.0
            fmt = "{:+.0f}" if "accuracy" in metric else "{:+.2g}"  # percentage points, or a loss
            image = heatmap_panel(
                ax, matrix * scale, rows, epochs, cmap, _scaled(norm, scale), fmt, annotate, j == 0
            )
            for k in block_ends:
                ax.axhline(k - 0.5, color="k", lw=0.6)
            ax.set_title(
                f"{mode} ablation, {cohort} {'samples' if cohort == 'all' else 'classes'}", fontsize=9
            )
            if i == len(modes) - 1:
                ax.set_xlabel("checkpoint epoch", fontsize=8)
    unit = "percentage points" if "accuracy" in metric else loss_unit
    fig.colorbar(image, ax=axes, shrink=0.8, extend="both", label=f"{metric} ({unit}; ablated - intact)")
    split = summary["split"].iloc[0] if "split" in summary and len(summary) else "test"
    n_idx = int(summary["n_indices"].max()) if len(summary) else 0
    fig.suptitle(
        f"{title}: effect of ablating each unit group on {split} {metric.removeprefix('delta_')} "
        f"(mean of {n_idx} index(es)" + ("; grey: no such classes yet)" if cohorts != ["all"] else ")"),
        fontsize=10,
    )
    return fig


def _scaled(norm: matplotlib.colors.Normalize, scale: float) -> matplotlib.colors.Normalize:
    return matplotlib.colors.Normalize(norm.vmin * scale, norm.vmax * scale)


# ------------------------------------------------------------------------------------------------
# Influence and the data-quality study (tables of scripts/poison_detection.py)
# ------------------------------------------------------------------------------------------------

#: Colours of the influence methods and baselines, the same in every influence figure.


def plot_head_ablation(summary: pd.DataFrame, title: str, metric: str = "delta_loss") -> plt.Figure:
    """A transformer's heads: heatmaps layer x head of the effect of ablating each head at the last
    ablated epoch, one column of panels per cohort (all sentences, then each data group) and one
    row per mode. ``summary`` as for :func:`plot_ablation_effect` (its ``head h`` groups; MLP neuron
    groups are left out); cells ``{metric}_mean`` (ablated - intact; red: the ablation hurts)."""
    epoch = int(summary["epoch"].max())
    heads = summary[(summary["epoch"] == epoch) & summary["group"].str.startswith("head ")].copy()
    blocks = list(dict.fromkeys(heads["block"]))
    heads["layer_pos"] = heads["block"].map({b: k for k, b in enumerate(blocks)})
    heads["head"] = heads["group"].str.removeprefix("head ").astype(int)
    cohorts = ["all", *sorted(c for c in heads["cohort"].unique() if str(c).startswith("data: "))]
    modes = list(pd.unique(heads["mode"]))
    column = f"{metric}_mean"
    scale = 100.0 if "accuracy" in metric else 1.0
    values = (heads[column].abs() * scale).dropna()
    vlim = max(float(np.percentile(values, 98)) if len(values) else 0.0, 1e-3)
    cmap = "RdBu" if "accuracy" in metric else "RdBu_r"  # red: worse
    n_heads = int(heads["head"].max()) + 1 if len(heads) else 1
    size = (0.5 * n_heads * len(cohorts) + 2.5, 0.45 * len(blocks) * len(modes) + 1.4)
    fig, axes = plt.subplots(len(modes), len(cohorts), figsize=size, squeeze=False, layout="constrained")
    image = None
    for i, mode in enumerate(modes):
        for j, cohort in enumerate(cohorts):
            sub = heads[(heads["mode"] == mode) & (heads["cohort"] == cohort)]
            matrix = np.full((len(blocks), n_heads), np.nan)
            matrix[sub["layer_pos"].to_numpy(), sub["head"].to_numpy()] = sub[column].to_numpy() * scale
            image = heatmap_panel(
                axes[i, j], matrix, [f"layer {k}" for k in range(len(blocks))], list(range(n_heads)), cmap,
                matplotlib.colors.Normalize(-vlim, vlim), "{:+.2f}" if scale == 1.0 else "{:+.0f}",
                n_heads * len(blocks) <= 200, j == 0,
            )  # fmt: skip
            axes[i, j].set_title(f"{mode}, {str(cohort).removeprefix('data: ')}", fontsize=9)
            if i == len(modes) - 1:
                axes[i, j].set_xlabel("head", fontsize=8)
    unit = "percentage points" if "accuracy" in metric else "nats"
    fig.colorbar(image, ax=axes, shrink=0.8, extend="both", label=f"{metric} ({unit}; ablated - intact)")
    split = summary["split"].iloc[0] if "split" in summary and len(summary) else "test"
    fig.suptitle(
        f"{title}: ablating each attention head, {split} {metric.removeprefix('delta_')} (epoch {epoch})"
    )
    return fig
