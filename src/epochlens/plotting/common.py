"""What every figure shares: saving as PNG and PDF, replicate bands, task boundaries, colours,
heatmap panels. Figures are drawn from the tidy tables (never from raw results), without torch."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.atomic import atomic_path
from epochlens.plotting.ticks import plain_log_labels
from epochlens.stats import mean_ci

#: Fewest replicate seeds for which figures draw a 95% confidence band (see replicate_line).
MIN_SEEDS_FOR_CI = 3

#: One colour per influence method (and the loss and random baselines) in every influence figure.
METHOD_COLORS = {
    "ekfac": "tab:blue",
    "kfac": "tab:orange",
    "diagonal": "tab:green",
    "identity": "tab:purple",
    "tracin": "tab:brown",
    "logra": "tab:cyan",
    "trak": "tab:pink",
    "tracin_rp": "tab:olive",
    "loss": "k",
    "random": "0.6",
}


def save_figure(fig: plt.Figure, paths: list[str | Path]) -> None:
    """Save ``fig`` to each path (format from the suffix), atomically, then close it."""
    plain_log_labels(fig)
    for path in map(Path, paths):
        with atomic_path(path) as tmp:
            fmt = path.suffix.lstrip(".")
            metadata = {"CreationDate": None} if fmt == "pdf" else None  # same results, same bytes
            fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
    plt.close(fig)


def replicate_line(ax: plt.Axes, sub: pd.DataFrame, color, label: str, column: str = "accuracy") -> None:
    """Mean of ``column`` over replicate indices per epoch, with a 95% band from 3 seeds on.

    With 2 seeds a t-interval (t = 12.7) says little and mostly hides the lines: each seed is drawn
    as a thin line instead.
    """
    if sub.empty:
        return
    by_epoch = sub.groupby("epoch")[column].apply(mean_ci)
    epochs = by_epoch.index.to_numpy()
    mean = np.array([m for m, _ in by_epoch])
    half = np.array([h for _, h in by_epoch])
    ax.plot(epochs, mean, marker="o", ms=3, color=color, label=label)
    if sub["index"].nunique() >= MIN_SEEDS_FOR_CI:
        ax.fill_between(epochs, mean - half, mean + half, color=color, alpha=0.2)
    elif sub["index"].nunique() > 1:
        for _, seed in sub.groupby("index"):
            ax.plot(seed["epoch"], seed[column], color=color, lw=0.6, alpha=0.4)


def replicates_note(n_idx: int) -> str:
    """Title suffix saying what the lines show (see replicate_line)."""
    if n_idx >= MIN_SEEDS_FOR_CI:
        return f" (mean and 95% CI over {n_idx} seeds)"
    if n_idx > 1:
        return f" (mean of {n_idx} seeds; thin lines: each seed)"
    return ""


def task_boundaries(ax: plt.Axes, last_epoch: int, epochs_per_task: int) -> None:
    for boundary in range(0, int(last_epoch) + 1, epochs_per_task):
        ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)


def step_epoch_axis(ax: plt.Axes, mapping: pd.DataFrame) -> None:
    """A top axis with the training epoch of the step on the bottom axis (piecewise linear
    between step 0 and the checkpoints' (step, epoch) pairs of a Trainer's trainer_state.json)."""
    pairs = mapping.dropna().sort_values("epoch")
    if pairs.empty:
        return
    steps, epochs = pairs["epoch"].to_numpy(float), pairs["train_epoch"].to_numpy(float)
    if steps[0] > 0:  # step 0 is epoch 0
        steps, epochs = np.r_[0.0, steps], np.r_[0.0, epochs]
    top = ax.secondary_xaxis(
        "top", functions=(lambda s: np.interp(s, steps, epochs), lambda e: np.interp(e, epochs, steps))
    )
    top.set_xlabel("training epoch", fontsize=8)
    top.tick_params(labelsize=7)


def cohort_colors(cohorts) -> dict[int, tuple]:
    cohorts = sorted(int(c) for c in cohorts)
    cmap = plt.get_cmap("viridis", max(len(cohorts), 2))
    return {c: cmap(k) for k, c in enumerate(cohorts)}


def heatmap_panel(
    ax: plt.Axes,
    matrix: np.ndarray,
    rows: list[str],
    epochs: list[int],
    cmap,
    norm,
    fmt: str,
    annotate: bool,
    row_labels: bool = True,
) -> plt.cm.ScalarMappable:
    """``matrix`` (rows x epochs) as coloured cells, NaN in light grey, values written if asked."""
    cmap = plt.get_cmap(cmap).copy()
    cmap.set_bad("0.9")
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    ax.set_xticks(range(len(epochs)), [str(e) for e in epochs], rotation=90 if len(epochs) > 12 else 0)
    ax.set_yticks(range(len(rows)), rows if row_labels else [])
    ax.tick_params(labelsize=7, length=0)
    if annotate:
        for (i, j), value in np.ndenumerate(matrix):
            if np.isfinite(value):
                r, g, b, _ = cmap(norm(value))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(
                    j, i, fmt.format(value), ha="center", va="center", fontsize=6, color="w" if dark else "k"
                )
    return image
