"""The data map (Dataset Cartography, Swayamdipta et al. 2020) of a run's dossier: each training
sample's variability (x) against its confidence (y) over the analysed checkpoints, coloured by its
correctness, the known corrupted samples marked; one panel per replicate index. A regression's
analogue puts the std over checkpoints of the absolute error (x) against its mean (y, inverted:
easy samples at the top) coloured by the last absolute error. The holdout is left out (not learned)."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Most points drawn per panel (the Cartography paper's plots subsample to 25k).
MAX_POINTS = 25_000
MAX_PANELS = 4
DRAWN = ("index", "variability", "confidence", "correctness", "error_variability", "error_mean")


def read_dossier(path) -> tuple[pd.DataFrame, dict]:
    """A dossier's training rows (``role`` and ``split`` train) in the columns the data map draws
    (a regression's last absolute error as ``final_abs_error``; no series, neighbours or texts
    read), and its metadata (a figure reads the file, not :mod:`epochlens.samples.dossier`)."""
    file = pq.ParquetFile(path)
    meta, names = json.loads(file.schema_arrow.metadata[b"epochlens"]), file.schema_arrow.names
    drawn = [c for c in (*DRAWN, "is_corrupted", "abs_error") if c in names]
    parts = []
    for group in range(file.num_row_groups):  # a row group at a time: its training rows kept
        rows = file.read_row_group(group, columns=[*drawn, "role", "split"])
        rows = rows.filter(pc.and_(pc.equal(rows["role"], "train"), pc.equal(rows["split"], "train")))
        if "abs_error" in drawn:
            last = pc.list_element(rows["abs_error"], max(0, len(meta["epochs"]) - 1))
            rows = rows.append_column("final_abs_error", last).drop_columns(["abs_error"])
        parts.append(rows.drop_columns(["role", "split"]))
    return pa.concat_tables(parts).to_pandas(split_blocks=True, self_destruct=True), meta


def _subsample(frame: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    return frame if len(frame) <= MAX_POINTS else frame.sample(MAX_POINTS, random_state=seed).sort_index()


def _axes_of(regression: bool) -> tuple[str, str, str, str, str]:
    if regression:
        return "error_variability", "error_mean", "variability of |error|", "mean |error|", "final |error|"
    return "variability", "confidence", "variability", "confidence", "correctness"


def _panel(ax: plt.Axes, frame: pd.DataFrame, regression: bool):
    xcol, ycol, xlabel, ylabel, clabel = _axes_of(regression)
    colour = frame["final_abs_error"] if regression else frame["correctness"]
    points = ax.scatter(
        frame[xcol], frame[ycol], c=colour, cmap="viridis" if regression else "RdYlBu", s=8,
        alpha=0.7, linewidths=0, vmin=None if regression else 0.0, vmax=None if regression else 1.0,
    )  # fmt: skip
    if "is_corrupted" in frame and frame["is_corrupted"].any():
        bad = frame[frame["is_corrupted"].astype(bool)]
        label = f"corrupted ({len(bad)})"
        ax.scatter(bad[xcol], bad[ycol], marker="x", c="k", s=22, linewidths=1.0, label=label)
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if regression:
        ax.invert_yaxis()
    ax.grid(alpha=0.3)
    return points, clabel


def plot_data_map(rows: pd.DataFrame, title: str, n_epochs: int, regression: bool = False) -> plt.Figure:
    """The data map of a dossier's training rows (:func:`read_dossier`) over ``n_epochs`` checkpoints,
    a panel per replicate index (the first :data:`MAX_PANELS`), at most :data:`MAX_POINTS` points each."""
    every = sorted(rows["index"].unique())
    indices = every[:MAX_PANELS]
    fig, axes = plt.subplots(1, len(indices), figsize=(5.2 * len(indices), 4.6), squeeze=False)
    for ax, index in zip(axes[0], indices, strict=True):
        frame = rows if len(every) == 1 else rows[rows["index"] == index]  # one index: no copy
        shown = _subsample(frame, seed=int(index))
        points, clabel = _panel(ax, shown, regression)
        note = f"{len(shown):,} of {len(frame):,}" if len(shown) < len(frame) else f"{len(frame):,} samples"
        ax.set_title(f"index {index} ({note})", fontsize=9)
        fig.colorbar(points, ax=ax, label=clabel)
    kind = "data map, regression analogue" if regression else "data map"
    fig.suptitle(f"{title}: {kind} over {n_epochs} checkpoints")
    fig.tight_layout()
    return fig


def corrupted_share_by_region(rows: pd.DataFrame) -> pd.DataFrame:
    """Share of corrupted samples among the hard-to-learn (confidence < 0.5) and the other training
    samples (:func:`read_dossier`) of each index: what the data map shows of the ground truth."""
    if "is_corrupted" not in rows or "confidence" not in rows:
        return pd.DataFrame(columns=["index", "region", "n", "corrupted"])
    region = np.where(rows["confidence"] < 0.5, "hard (confidence < 0.5)", "easy or ambiguous")
    grouped = rows.assign(region=region).groupby(["index", "region"])["is_corrupted"]
    return grouped.agg(n="size", corrupted="mean").reset_index()
