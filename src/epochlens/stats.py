"""Means and Student-t 95% intervals over replicates: the one place where intervals are computed.

Replicate indices (independently trained models) are the independent units of every table and
figure; probe seeds are technical repeats reduced the same way. With n replicates the interval is
mean ± t₀.₉₇₅(n − 1) · s / √n, s the sample standard deviation (ddof 1); NaN (tables) or 0
(figures, :func:`mean_ci`) with fewer than two.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.special import stdtrit


def ci95_halfwidth(std: np.ndarray | float, n: np.ndarray | int) -> np.ndarray:
    """Half-width t₀.₉₇₅(n − 1) · std / √n of a Student-t 95% interval; NaN where n < 2."""
    n = np.asarray(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(n > 1, stdtrit(np.maximum(n - 1, 1), 0.975), np.nan)
        return t * np.asarray(std) / np.sqrt(n)


def mean_ci(values: pd.Series | np.ndarray) -> tuple[float, float]:
    """Mean and 95% half-width over replicates (few seeds: t, not 1.96); half-width 0 for one value."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), float(ci95_halfwidth(v.std(ddof=1), len(v)))


def over_replicates(
    table: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str], count: str = "n_indices"
) -> pd.DataFrame:
    """Per group of ``keys``: the number of rows (column ``count``), and per metric ``_mean``,
    ``_std`` (ddof 1) and ``_ci95`` (Student-t 95% half-width) over the rows of the group (one row
    per replicate).

    Groups keep their order of first appearance; NaN keys form groups of their own.
    """
    keys = [k for k in keys if k in table.columns]
    grouped = table.groupby(keys, sort=False, dropna=False)
    out = grouped.size().rename(count).reset_index()
    n = out[count].to_numpy()
    for m in metrics:
        agg = grouped[m].agg(["mean", "std"]).reset_index(drop=True)
        out[f"{m}_mean"] = agg["mean"].to_numpy()
        out[f"{m}_std"] = agg["std"].to_numpy()
        out[f"{m}_ci95"] = ci95_halfwidth(out[f"{m}_std"].to_numpy(), n)
    return out


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation of two equally long samples: Pearson's correlation of their
    ranks (ties get their mean rank, as scipy.stats.spearmanr), over the pairs where neither is NaN;
    NaN for fewer than 3 pairs. From pandas ranks, so that a table or plot job does not load
    scipy.stats (~50 MB and half a second; pandas' own ``corr(method="spearman")`` imports it)."""
    x, y = pd.Series(np.asarray(x, np.float64).ravel()), pd.Series(np.asarray(y, np.float64).ravel())
    if len(x) != len(y):
        raise ValueError(f"samples of different lengths: {len(x)} and {len(y)}")
    both = x.notna() & y.notna()
    if both.sum() < 3:
        return float("nan")
    return float(x[both].rank().corr(y[both].rank(), method="pearson"))


def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination averaged over the outputs, as scikit-learn's ``r2_score``
    (``multioutput="uniform_average"``, ``force_finite``: an output whose targets are constant
    scores 1 when predicted exactly, else 0), without importing scikit-learn (about 1.5 s, paid by
    every job that evaluates a regression). (N,) or (N, D) arrays; NaN for fewer than two samples."""
    y = np.asarray(y_true, dtype=np.float64)
    y = y.reshape(len(y), -1)
    z = np.asarray(y_pred, dtype=np.float64).reshape(y.shape)
    if len(y) < 2:
        return float("nan")
    residual = ((y - z) ** 2).sum(0)
    total = ((y - y.mean(0)) ** 2).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = np.where(
            total > 0, 1.0 - residual / np.where(total > 0, total, 1.0), np.where(residual == 0, 1.0, 0.0)
        )
    return float(scores.mean())
