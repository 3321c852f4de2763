"""Does a per-sample signal find the corrupted training samples? Metrics, the table, baselines.

A signal is one score per training sample (N,), higher = more suspicious: self-influence, the
influence on misclassified queries (see :func:`query_signal`), the loss, or random numbers.
For a set of corrupted positions:

* ``auroc``: area under the ROC curve of the signal separating corrupted from clean samples
  (``sklearn.metrics.roc_auc_score``); 0.5 is chance, 1 perfect.
* ``precision_at_k``: share of corrupted samples among the k highest signals, k = the number of
  corrupted samples (then precision = recall); chance is the corrupted fraction. Ties are broken
  by position, so the value is deterministic.

Samples whose signal is NaN (skipped for NaN/Inf gradients, or of inactive classes) are left out
of both metrics.

The detection table is tidy, one row per (method, signal), with columns
``method, signal, epoch, index, auroc, precision_at_k, status``: ``method`` the influence method
(ekfac, kfac, diagonal, identity, tracin) or the baseline ("loss", "random"), ``signal`` what was
ranked ("self_influence", "query_influence", "loss", "random"), ``epoch`` the checkpoint,
``index`` the replicate (the run's index-{i}), ``status`` ``ok``, or why the metrics are empty
(no corrupted samples known, every scored sample corrupted, nothing scored): never a silent NaN.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import pandas as pd

from epochlens.stats import spearman

DETECTION_COLUMNS = ("method", "signal", "epoch", "index", "auroc", "precision_at_k", "status")
#: Why a detection row has no metrics.
NO_GROUND_TRUTH = (
    "no corrupted samples known: set data.corruption (the pipeline corrupts) or data.ground_truth (yours)"
)
AGREEMENT_COLUMNS = ("transform_a", "transform_b", "spearman", "n")


def _mask(corrupted: np.ndarray, n: int) -> np.ndarray:
    corrupted = np.asarray(corrupted)
    if corrupted.dtype == bool:
        if len(corrupted) != n:
            raise ValueError(f"corrupted mask has {len(corrupted)} entries for {n} samples")
        return corrupted
    mask = np.zeros(n, dtype=bool)
    if corrupted.size and (corrupted.min() < 0 or corrupted.max() >= n):
        raise ValueError(f"corrupted indices must lie in [0, {n}), got {corrupted.min()}..{corrupted.max()}")
    mask[corrupted.astype(np.int64)] = True
    return mask


def detection_metrics(scores: np.ndarray, corrupted: np.ndarray) -> dict[str, float]:
    """AUROC and precision at k of ``scores`` (N,) for ``corrupted`` (positions, or a (N,) bool mask).

    Returns:
        dict with ``auroc``, ``precision_at_k`` (NaN when the scored samples are all corrupted or
        all clean), ``k``, ``n_scored`` and ``status`` (``ok``, or why the metrics are NaN).
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError(f"scores must be (N,), got shape {scores.shape}")
    mask = _mask(corrupted, len(scores))
    keep = np.isfinite(scores)
    s, m = scores[keep], mask[keep]
    k = int(m.sum())
    if k == 0 or k == len(s):
        if not mask.any():
            status = NO_GROUND_TRUTH
        elif len(s) == 0:
            status = "no sample scored (every score NaN)"
        elif k == 0:
            status = "no corrupted sample among the scored ones"
        else:
            status = "every scored sample is corrupted"
        return {"auroc": np.nan, "precision_at_k": np.nan, "k": k, "n_scored": len(s), "status": status}
    from sklearn.metrics import roc_auc_score  # here: the influence jobs import this module

    order = np.argsort(-s, kind="stable")
    return {
        "auroc": float(roc_auc_score(m, s)),
        "precision_at_k": float(m[order[:k]].mean()),
        "k": k,
        "n_scored": len(s),
        "status": "ok",
    }


def detection_table(
    signals: Mapping[tuple[str, str], np.ndarray], corrupted: np.ndarray, epoch: int, index: int
) -> pd.DataFrame:
    """Tidy table (columns DETECTION_COLUMNS), one row per ``(method, signal)`` key of ``signals``."""
    rows = []
    for (method, signal), scores in signals.items():
        metrics = detection_metrics(scores, corrupted)
        rows.append(
            {
                "method": method,
                "signal": signal,
                "epoch": int(epoch),
                "index": int(index),
                "auroc": metrics["auroc"],
                "precision_at_k": metrics["precision_at_k"],
                "status": metrics["status"],
            }
        )
    return pd.DataFrame(rows, columns=list(DETECTION_COLUMNS))


def baseline_signals(losses: np.ndarray, seed: int = 0) -> dict[tuple[str, str], np.ndarray]:
    """The loss baseline (per-sample training loss, (N,)) and a seeded uniform random baseline."""
    losses = np.asarray(losses, dtype=np.float64)
    rand = np.random.default_rng(seed).random(len(losses))
    rand[~np.isfinite(losses)] = np.nan  # scored on the same samples as the loss
    return {("loss", "loss"): losses, ("random", "random"): rand}


def query_signal(
    pairwise: np.ndarray, queries: np.ndarray | None = None, sign: float = 1.0, standardize: bool = True
) -> np.ndarray:
    """One suspicion score per training sample from pairwise influence (Q, N) on chosen queries.

    Args:
        pairwise: scores[q, n] = influence of training sample n on query q.
        queries: which queries to use (positions or a (Q,) bool mask), e.g. the misclassified ones;
            None: all.
        sign: +1 when the queries are scored under their *predicted* labels (corrupted samples
            support the wrong prediction: positive influence), -1 under their true labels.
        standardize: z-score each query's row first, so that queries with large gradients do not
            dominate the mean.

    Returns:
        (N,) mean over the queries of sign x (standardised) influence; NaN where every used query
        is NaN for the sample.
    """
    pairwise = np.asarray(pairwise, dtype=np.float64)
    if pairwise.ndim != 2:
        raise ValueError(f"pairwise must be (Q, N), got shape {pairwise.shape}")
    rows = pairwise if queries is None else pairwise[_mask(queries, len(pairwise))]
    rows = rows[np.isfinite(rows).any(1)]
    if len(rows) == 0:
        return np.full(pairwise.shape[1], np.nan)
    if standardize:
        mu = np.nanmean(rows, axis=1, keepdims=True)
        sd = np.nanstd(rows, axis=1, keepdims=True)
        rows = (rows - mu) / np.where(sd > 0, sd, 1.0)
    with np.errstate(all="ignore"):
        counts = np.isfinite(rows).sum(0)
        total = np.nansum(rows, axis=0)
    return np.where(counts > 0, sign * total / np.maximum(counts, 1), np.nan)


def transform_agreement(signals: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Spearman correlation of the signals of every pair of query transforms.

    Args:
        signals: transform name -> (N,) signal (or any same-shaped scores, e.g. flattened pairwise).

    Returns:
        DataFrame with columns transform_a, transform_b, spearman, n (samples finite in both).
    """
    rows = []
    for a, b in itertools.combinations(signals, 2):
        x, y = np.asarray(signals[a], np.float64).ravel(), np.asarray(signals[b], np.float64).ravel()
        if x.shape != y.shape:
            raise ValueError(f"signals {a!r} {x.shape} and {b!r} {y.shape} differ in shape")
        ok = np.isfinite(x) & np.isfinite(y)
        rho = spearman(x[ok], y[ok])
        rows.append({"transform_a": a, "transform_b": b, "spearman": rho, "n": int(ok.sum())})
    return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))
