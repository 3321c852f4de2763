"""Runs compared: every index's value per run, each run's mean and 95% interval, the differences."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

#: Axis labels of the metrics (the split is added where it applies).
METRIC_LABELS = {
    "accuracy": "accuracy",
    "loss": "mean loss",
    "mse": "MSE",
    "mae": "MAE",
    "r2": "R²",
    "mean_curvature": "mean curvature of the training images",
}


def plot_comparisons(table: pd.DataFrame, values: pd.DataFrame) -> plt.Figure:
    """One row of panels per comparison, one panel per metric: each replicate index's value as a dot
    per run, the run's mean with its Student-t 95% interval as a bar, the baseline's mean as a
    dashed line, and under each other run its difference with Welch's 95% interval and p-value.

    Args:
        table: the comparison table (:data:`epochlens.compare.TABLE_COLUMNS`).
        values: the per-index values (:data:`epochlens.compare.VALUE_COLUMNS`).
    """
    comparisons = list(dict.fromkeys(table["comparison"]))
    if not comparisons:
        fig, ax = plt.subplots(figsize=(4, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "no comparisons configured", ha="center", va="center")
        return fig
    n_cols = max(table[table["comparison"] == c]["metric"].nunique() for c in comparisons)
    n_runs = max(table[table["comparison"] == c]["run"].nunique() for c in comparisons)
    width = max(4.2, 2.3 * n_runs)
    fig, axes = plt.subplots(
        len(comparisons), n_cols, figsize=(width * n_cols, 4.6 * len(comparisons)), squeeze=False
    )
    for row, name in enumerate(comparisons):
        sub = table[table["comparison"] == name]
        metrics = list(dict.fromkeys(sub["metric"]))
        for col in range(n_cols):
            ax = axes[row, col]
            if col >= len(metrics):
                ax.axis("off")
                continue
            metric = metrics[col]
            _panel(
                ax,
                sub[sub["metric"] == metric],
                values[(values["comparison"] == name) & (values["metric"] == metric)],
            )
    fig.suptitle(
        "runs compared: each index (dots), mean and 95% CI (bars); under each run, its difference "
        "(Welch 95% CI, p-value)\nintervals cut to what the metric can take (accuracy within [0, 1]): "
        "with 2 seeds, t = 12.7 makes them wide"
    )
    fig.tight_layout()
    return fig


def _panel(ax: plt.Axes, rows: pd.DataFrame, values: pd.DataFrame) -> None:
    runs = list(dict.fromkeys(rows["run"]))
    own = rows.drop_duplicates("run").set_index("run")
    palette = plt.get_cmap("tab10")
    for x, run in enumerate(runs):
        color = palette(x % 10)
        v = values[values["run"] == run]["value"].to_numpy(float)
        # Dots spread evenly across a narrow band, in index order: the same figure on every redraw.
        offsets = np.linspace(-0.12, 0.12, len(v)) if len(v) > 1 else np.zeros(len(v))
        ax.scatter(x - 0.18 + offsets, v, s=16, color=color, alpha=0.7, lw=0, zorder=3)
        s = own.loc[run]
        ax.errorbar(
            x + 0.12,
            s["mean"],
            yerr=[[s["mean"] - s["ci95_low"]], [s["ci95_high"] - s["mean"]]],
            fmt="o",
            color=color,
            ecolor="k",
            elinewidth=1.2,
            capsize=5,
            ms=6,
            zorder=4,
        )
    ax.axhline(own.loc[runs[0], "mean"], color="0.5", ls="--", lw=0.8, zorder=1)
    ax.set_xticks(range(len(runs)), [_run_label(run, rows, x == 0) for x, run in enumerate(runs)], fontsize=7)
    ax.set_xlim(-0.6, len(runs) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    metric, split = rows["metric"].iloc[0], rows["split"].iloc[0]
    label = METRIC_LABELS.get(metric, metric)
    ax.set_ylabel(label if split == "train" else f"{split} {label}")
    epochs = sorted({int(e) for e in rows["epoch"]})
    at = f"epoch {epochs[0]}" if len(epochs) == 1 else "epochs " + ", ".join(map(str, epochs))
    ax.set_title(f"{rows['comparison'].iloc[0]}: {label} ({at})", fontsize=9)


def _run_label(run: str, rows: pd.DataFrame, baseline: bool) -> str:
    """The run's name, its seed count, and its difference from each run it is set against."""
    n = int(rows[rows["run"] == run]["n"].iloc[0])
    lines = [f"{run} (n={n})"]
    if baseline:
        return "\n".join([*lines, "baseline"])
    for _, r in rows[(rows["run"] == run) & (rows["versus"].fillna("") != "")].iterrows():
        lines.append(f"Δ vs {r['versus']}: {_fmt(r['difference'])}")
        if pd.isna(r["p_value"]):
            lines.append("(no spread: no CI)")
        else:
            lines.append(f"[{_fmt(r['difference_ci95_low'])}, {_fmt(r['difference_ci95_high'])}]")
            lines.append(f"p {_p(r['p_value'])}")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:+.3g}"


def _p(p: float) -> str:
    return f"= {p:.2g}" if p >= 0.001 else "< 0.001"
