"""The linear datamodeling score figure: how well each influence method predicts retraining."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.plotting.common import METHOD_COLORS


def plot_lds(lds: pd.DataFrame, queries: pd.DataFrame, title: str) -> plt.Figure:
    """Left: LDS of each method at the last influence epoch, one point per replicate index with
    its 95% bootstrap interval over the retrained subsets, ``random`` as the chance reference.
    Right: the spread of the per-query correlations that each LDS averages."""
    epoch = int(lds["epoch"].max())
    lds = lds[lds["epoch"] == epoch]
    queries = queries[queries["epoch"] == epoch] if len(queries) else queries
    methods = list(dict.fromkeys(lds["method"]))
    fig, (ax, ax_q) = plt.subplots(1, 2, figsize=(10.5, 4.2), gridspec_kw={"width_ratios": [1, 1.2]})
    indices = sorted(lds["index"].unique())
    offsets = np.linspace(-0.15, 0.15, len(indices)) if len(indices) > 1 else [0.0]
    for x, method in enumerate(methods):
        color = METHOD_COLORS.get(method, "0.3")
        for dx, index in zip(offsets, indices, strict=True):
            row = lds[(lds["method"] == method) & (lds["index"] == index)]
            if row.empty:
                continue
            v, lo, hi = (float(row[c].iloc[0]) for c in ("lds", "ci_low", "ci_high"))
            err = [[v - lo], [hi - v]] if np.isfinite(lo) else None
            ax.errorbar(x + dx, v, yerr=err, fmt="o", color=color, capsize=4, ms=6)
            ax.annotate(f"{v:.2f}", (x + dx, v), textcoords="offset points", xytext=(8, -3), fontsize=8)
    ax.axhline(0, color="0.6", lw=0.8, ls=":")
    ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    ax.set_xlim(-0.6, len(methods) - 0.4)
    ax.set_ylabel("LDS (Spearman ρ, mean over queries)")
    first = lds.iloc[0]
    ax.set_title(
        f"{int(first['n_subsets'])} retrainings on {first['fraction']:.0%} of the training samples; "
        "95% CI over subsets",
        fontsize=9,
    )
    ax.grid(axis="y", alpha=0.3)
    if len(queries):
        data = [queries.loc[queries["method"] == m, "spearman"].dropna().to_numpy() for m in methods]
        parts = ax_q.boxplot(data, positions=range(len(methods)), widths=0.5, showfliers=False)
        for k, values in enumerate(data):
            jitter = np.random.default_rng(k).uniform(-0.12, 0.12, len(values))
            ax_q.scatter(k + jitter, values, s=6, alpha=0.5, color=METHOD_COLORS.get(methods[k], "0.3"))
        for line in parts["medians"]:
            line.set_color("k")
        ax_q.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    ax_q.axhline(0, color="0.6", lw=0.8, ls=":")
    ax_q.set_ylabel("per-query Spearman ρ over the subsets")
    ax_q.set_title(f"{int(first['n_queries'])} queries (one point each)", fontsize=9)
    ax_q.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title}: linear datamodeling score at epoch {epoch}")
    fig.tight_layout()
    return fig
