"""The data-quality study around the influence engine: queries, TracIn over a class schedule, signals.

A run trains on a training set of which some images were corrupted on purpose
(:mod:`epochlens.study.corruption`); at a checkpoint, influence scores rank the training images, and
:mod:`epochlens.study.detection` measures how well each ranking finds the corrupted ones. This module
holds the steps between the two (torch-free: the detection tables run without it; the queries are
chosen by :mod:`epochlens.study.queries`):

* :func:`~epochlens.influence.accumulate.accumulate_tracin` (defined with the influence engine): TracIn's
  sum over checkpoints where each image counts only at the checkpoints at which its class had been
  trained (class-incremental schedules);
* :func:`study_signals`: the per-image signals of one method (self-influence, influence on the
  queries under each query transform, reduced over the queries by :func:`reduce_query_influence`);
* :func:`roc_table`, :func:`top_ranked`: tidy tables behind the ROC and top-images figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from epochlens.errors import ConfigError
from epochlens.influence.accumulate import accumulate_tracin  # noqa: F401 (public here too)
from epochlens.influence.settings import influence_settings  # noqa: F401 (public here too)
from epochlens.study.detection import (
    baseline_signals,
    detection_table,
    query_signal,
    transform_agreement,
)
from epochlens.study.settings import QUERY_REDUCTIONS


def query_signal_name(transform: str) -> str:
    """Name of the query-influence signal under a query transform (``query_influence`` for none)."""
    return "query_influence" if transform == "none" else f"query_influence_{transform}"


def reduce_query_influence(pairwise: np.ndarray, sign: float = 1.0, reduce: str = "max") -> np.ndarray:
    """One suspicion score per training image (N,) from its influence on the queries (Q, N).

    Each query's row is standardised (z-scores over the training images, so that queries with
    large gradients do not dominate), multiplied by ``sign``, then reduced over the queries:

    * ``max``: the largest, i.e. how strongly the image pushes the one query it pushes most. A
      corrupted image typically matters to few queries (a flipped label ties two classes; a
      misclassified query involves one pair), so a mean dilutes it.
    * ``mean``: the mean (:func:`epochlens.study.detection.query_signal`): images that push most queries.

    Rows that are all NaN (queries skipped) are ignored; NaN where no query scores the image.
    """
    if reduce == "mean":
        return query_signal(pairwise, sign=sign)
    if reduce != "max":
        raise ConfigError(f"queries.reduce={reduce!r} must be one of {list(QUERY_REDUCTIONS)}")
    pairwise = np.asarray(pairwise, dtype=np.float64)
    rows = pairwise[np.isfinite(pairwise).any(1)] if pairwise.ndim == 2 else pairwise
    if pairwise.ndim != 2 or len(rows) == 0:
        return np.full(pairwise.shape[-1], np.nan)
    mu = np.nanmean(rows, axis=1, keepdims=True)
    sd = np.nanstd(rows, axis=1, keepdims=True)
    z = sign * (rows - mu) / np.where(sd > 0, sd, 1.0)
    finite = np.isfinite(z)
    best = np.where(finite, z, -np.inf).max(0)
    return np.where(finite.any(0), best, np.nan)


def study_signals(
    method: str,
    self_scores: np.ndarray,
    pairwise: Mapping[str, np.ndarray],
    sign: float,
    reduce: str = "max",
) -> dict[tuple[str, str], np.ndarray]:
    """Per-image suspicion signals (N,) of one method, keyed (method, signal).

    ``self_influence`` is the self-influence; ``query_influence[_<transform>]`` the influence on
    the queries reduced by :func:`reduce_query_influence` (one per query transform; all NaN
    without queries).
    """
    arrays = {"self_influence": self_scores, "query_sign": sign}
    return job_signals(method, {**arrays, **{f"pairwise_{t}": v for t, v in pairwise.items()}}, reduce)


def job_signals(method: str, arrays: Mapping[str, np.ndarray], reduce: str = "max") -> dict:
    """:func:`study_signals` of one ``scores.npz``'s arrays, its scores whole or a store's summary."""
    signals = {(method, "self_influence"): np.asarray(arrays["self_influence"], np.float64)}
    for transform, values in query_signals(arrays, reduce).items():
        signals[(method, query_signal_name(transform))] = values
    return signals


def query_transforms(arrays: Mapping[str, np.ndarray], reduce: str = "max") -> list[str]:
    """The query transforms of one ``scores.npz``: of its ``pairwise_*`` scores, or of the
    ``query_influence_{reduce}_*`` a store's summary keeps instead (epochlens.influence.store_summary)."""
    whole = any(k.startswith("pairwise_") for k in arrays)
    prefix = "pairwise_" if whole else f"query_influence_{reduce}_"
    return [k.removeprefix(prefix) for k in arrays if k.startswith(prefix)]


def query_signals(
    arrays: Mapping[str, np.ndarray], reduce: str = "max", transforms: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Per query transform (all, or ``transforms``), the images' influence on the queries (N,):
    :func:`reduce_query_influence` of its pairwise scores signed by ``query_sign``, or as a store's
    summary keeps it."""
    sign = float(arrays.get("query_sign", 1.0))
    signals = {}
    for t in query_transforms(arrays, reduce) if transforms is None else transforms:
        kept = arrays.get(f"query_influence_{reduce}_{t}")
        signals[t] = (
            kept if kept is not None else reduce_query_influence(arrays[f"pairwise_{t}"], sign, reduce)
        )
    return signals


def roc_table(signals: Mapping[tuple[str, str], np.ndarray], corrupted: np.ndarray) -> pd.DataFrame:
    """ROC curve points of every signal: columns method, signal, fpr, tpr (NaN scores left out)."""
    frames = []
    for (method, signal), scores in signals.items():
        scores = np.asarray(scores, np.float64)
        mask = np.zeros(len(scores), bool)
        mask[np.asarray(corrupted, np.int64)] = True
        keep = np.isfinite(scores)
        if mask[keep].all() or not mask[keep].any():
            continue
        from sklearn.metrics import roc_curve  # here: the influence jobs import this module

        fpr, tpr, _ = roc_curve(mask[keep], scores[keep])
        frames.append(pd.DataFrame({"method": method, "signal": signal, "fpr": fpr, "tpr": tpr}))
    columns = ["method", "signal", "fpr", "tpr"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def top_ranked(
    signals: Mapping[tuple[str, str], np.ndarray], corrupted: np.ndarray, labels: np.ndarray, k: int
) -> pd.DataFrame:
    """The k highest-scored training images of every signal.

    Columns: method, signal, rank (1 = most suspicious), sample (training position), score, label
    (the label trained on; a regression's float targets: ``target``, the values trained on, as
    text), corrupted (bool). Ties are broken by position.
    """
    mask = np.zeros(len(labels), bool)
    mask[np.asarray(corrupted, np.int64)] = True
    regression = np.issubdtype(np.asarray(labels).dtype, np.floating)
    name = "target" if regression else "label"
    rows = []
    for (method, signal), scores in signals.items():
        scores = np.asarray(scores, np.float64)
        finite = np.flatnonzero(np.isfinite(scores))
        order = finite[np.argsort(-scores[finite], kind="stable")][:k]
        for rank, n in enumerate(order, start=1):
            rows.append(
                {
                    "method": method,
                    "signal": signal,
                    "rank": rank,
                    "sample": int(n),
                    "score": float(scores[n]),
                    name: target_text(labels[n]) if regression else int(labels[n]),
                    "corrupted": bool(mask[n]),
                }
            )
    return pd.DataFrame(rows, columns=["method", "signal", "rank", "sample", "score", name, "corrupted"])


def target_text(target: np.ndarray | float, digits: int = 3) -> str:
    """A regression target as compact text: ``0.123`` or ``[0.12, -1.5, ...]`` (at most 6 values)."""
    values = np.atleast_1d(np.asarray(target, dtype=np.float64)).ravel()
    shown = ", ".join(f"{v:.{digits}g}" for v in values[:6]) + (", ..." if len(values) > 6 else "")
    return shown if np.ndim(target) == 0 else f"[{shown}]"


def detection_tables(
    run: str,
    jobs: Sequence[Mapping],
    scores: Sequence[str | Path],
    diagnostics: Sequence[str | Path],
    corrupted: np.ndarray,
    labels: np.ndarray,
    seed: int,
    top_k: int,
    reduce: str = "max",
) -> dict[str, pd.DataFrame]:
    """The study's tables of one run from the scores of each (index, epoch, method) job.

    Args:
        run: the run's name (first column of every table but ``detection``).
        jobs: ``{"index", "epoch", "method"}`` of each job, in the order of ``scores``.
        scores, diagnostics: each job's ``scores.npz`` and ``diagnostics.csv``.
        corrupted: int64 positions of the corrupted training images.
        labels: (N,) the labels trained on.
        seed: seed of the random baseline (plus the index).
        top_k: top-ranked images kept per signal.
        reduce: how query influence is reduced per image (:func:`reduce_query_influence`).

    Returns:
        ``detection`` (columns :data:`epochlens.study.detection.DETECTION_COLUMNS`), ``agreement``
        (rankings across query transforms), ``roc``, ``top`` and ``conditioning`` (per layer).
    """
    detection, agreement, roc, top, conditioning = [], [], [], [], []
    baselines_done = set()
    for job, scores_path, diag_path in zip(jobs, scores, diagnostics, strict=True):
        index, epoch, method = int(job["index"]), int(job["epoch"]), job["method"]
        key = {"index": index, "epoch": epoch}
        with np.load(scores_path) as npz:
            arrays = {name: npz[name] for name in npz.files}
        transforms = query_transforms(arrays, reduce)
        pairwise = {t: arrays[f"pairwise_{t}"] for t in transforms if f"pairwise_{t}" in arrays}
        signals = job_signals(method, arrays, reduce)
        if (index, epoch) not in baselines_done:  # the loss and random baselines once per checkpoint
            baselines_done.add((index, epoch))
            signals.update(baseline_signals(arrays["loss"], seed=seed + index))
        detection.append(detection_table(signals, corrupted, epoch, index))
        roc.append(roc_table(signals, corrupted).assign(**key))
        top.append(top_ranked(signals, corrupted, labels, top_k).assign(**key))
        if len(transforms) > 1:
            per_transform = {t: signals[(method, query_signal_name(t))] for t in transforms}
            agree = transform_agreement(per_transform).assign(scores="query_signal")
            if pairwise:  # not of a summary
                flat = transform_agreement(pairwise).assign(scores="pairwise")
                agree = pd.concat([agree, flat])
            agreement.append(agree.assign(method=method, **key))
        conditioning.append(pd.read_csv(diag_path).assign(method=method, **key))

    def first(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
        df = df.copy()
        df.insert(0, "run", run)
        return df[["run", *cols, *[c for c in df.columns if c not in ("run", *cols)]]]

    agreement_cols = ["index", "epoch", "method", "scores", "transform_a", "transform_b", "spearman", "n"]
    return {
        "detection": pd.concat(detection, ignore_index=True),
        "agreement": first(pd.concat(agreement, ignore_index=True), *agreement_cols[:4])
        if agreement
        else pd.DataFrame(columns=["run", *agreement_cols]),
        "roc": first(pd.concat(roc, ignore_index=True), "index", "epoch", "method", "signal"),
        "top": first(pd.concat(top, ignore_index=True), "index", "epoch", "method", "signal"),
        "conditioning": first(
            pd.concat(conditioning, ignore_index=True), "index", "epoch", "method", "layer"
        ),
    }
