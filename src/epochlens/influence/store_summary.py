"""The store's influence on many queries without the (Q, N) matrix: each sample's reductions over the
queries and the top-k neighbours both ways, exact, in two reads of the store (:func:`store_summary`).

At a million training samples, a thousand queries and four query transforms the full scores are 16 GB
of float32. What the tables and the dossier read of them is smaller:

* each sample's self-influence;
* per query transform, each sample's standardised influence reduced over the queries, both ways the
  study reduces it (``max`` and ``mean`` of each query's z-scores over the training samples: see
  ``epochlens.study.poison.reduce_query_influence``): the moments of each query's scores from the
  first read (combined chunk by chunk), the z-scores from the second;
* for one transform (the untransformed queries), each query's k samples of largest and of smallest
  influence and each sample's k queries of largest and smallest: exact, ties to the lower position,
  as the dossier ranks a full matrix.

Scores are rounded to float32 first, as a full ``scores.npz`` stores them, so that both give the same
tables and neighbours. Memory: a chunk of scores and (Q + N) x k neighbours, not Q x N.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from epochlens.influence.gradient_store import CHUNK_BYTES, GradientStore
from epochlens.ranking import first_k

#: Neighbours kept per query and per sample, each way.
NEIGHBOURS = 10
#: How the standardised influence is reduced over the queries (both are kept).
REDUCTIONS = ("max", "mean")
#: Largest chunk of float64 scores computed at once (bytes).
SCORE_BYTES = 256 * 2**20


@dataclass
class StoreSummary:
    """What :func:`store_summary` gives, in the store's rows.

    Attributes:
        self_influence: (N,) g̃_nᵀ P g̃_n (NaN for unusable rows).
        reduced: ``{reduce}_{transform}`` -> (N,) the sample's standardised influence on the queries
            reduced over them (NaN where no query scores it).
        neighbours: ``top_train`` / ``bottom_train`` -> (rows (Q, k) of the store, -1 past the
            finite; scores (Q, k), NaN there), the k samples of largest / smallest influence on each
            query; ``proponents`` / ``opponents`` -> (queries (N, k'), scores), k' = min(k, Q).
    """

    self_influence: np.ndarray
    reduced: dict[str, np.ndarray] = field(default_factory=dict)
    neighbours: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class RunningTopK:
    """The k smallest keys of each of R rows over column chunks that come in increasing columns."""

    def __init__(self, rows: int, k: int) -> None:
        self.k = k
        self.key = np.zeros((rows, 0))
        self.index = np.zeros((rows, 0), np.int64)

    def update(self, key: np.ndarray, start: int) -> None:
        keys = np.concatenate([self.key, key], 1)
        columns = np.broadcast_to(np.arange(start, start + key.shape[1]), key.shape)
        index = np.concatenate([self.index, columns], 1)  # kept ones first: lower columns, sorted
        pick = first_k(keys, self.k)
        self.key, self.index = np.take_along_axis(keys, pick, 1), np.take_along_axis(index, pick, 1)

    def result(self, sign: float) -> tuple[np.ndarray, np.ndarray]:
        finite = np.isfinite(self.key)
        return np.where(finite, self.index, -1), np.where(finite, sign * self.key, np.nan)


class Moments:
    """Count, mean and squared deviations of each row's finite values over column chunks (Chan et
    al.'s pairwise combination): the mean and population SD of each query's scores."""

    def __init__(self, rows: int) -> None:
        self.count, self.mean, self.m2 = np.zeros(rows), np.zeros(rows), np.zeros(rows)

    def update(self, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        count = finite.sum(1).astype(np.float64)
        with np.errstate(all="ignore"):
            mean = np.where(count > 0, np.where(finite, values, 0.0).sum(1) / np.maximum(count, 1), 0.0)
            m2 = np.where(finite, (values - mean[:, None]) ** 2, 0.0).sum(1)
        total = self.count + count
        delta = mean - self.mean
        share = np.where(total > 0, count / np.maximum(total, 1), 0.0)
        self.mean = self.mean + delta * share
        self.m2 = self.m2 + m2 + delta**2 * self.count * share
        self.count = total

    def standardise(self, values: np.ndarray) -> np.ndarray:
        """z-scores of ``values`` (rows as the moments'), an SD of 0 taken as 1."""
        sd = np.sqrt(self.m2 / np.maximum(self.count, 1))
        return (values - self.mean[:, None]) / np.where(sd > 0, sd, 1.0)[:, None]


def _rounded(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32).astype(np.float64)


def _reduce(z: np.ndarray, sign: float) -> dict[str, np.ndarray]:
    """``max`` and ``mean`` over the queries (rows) of sign x z, NaN where no query scores a sample."""
    finite = np.isfinite(z)
    counts = finite.sum(0)
    with np.errstate(all="ignore"):
        best = np.where(finite, sign * z, -np.inf).max(0) if len(z) else np.full(z.shape[1], -np.inf)
        mean = sign * np.nansum(z, axis=0) / np.maximum(counts, 1)
    return {"max": np.where(counts > 0, best, np.nan), "mean": np.where(counts > 0, mean, np.nan)}


def store_summary(
    store: GradientStore,
    curvature,
    queries: Mapping[str, np.ndarray],
    sign: float = 1.0,
    k: int = NEIGHBOURS,
    neighbours_of: str = "none",
    chunk_bytes: int = CHUNK_BYTES,
) -> StoreSummary:
    """Self-influence, reductions and neighbours (:class:`StoreSummary`) of the store's influence
    (P g̃_q)ᵀ g̃_n on ``queries`` (transform -> P g̃_q, (Q, width), the same Q for each); ``sign``
    of the queries' influence (the study's ``query_sign``); neighbours of ``neighbours_of``."""
    names, n = list(queries), len(store)
    q = len(queries[names[0]]) if names else 0
    stacked = np.concatenate([queries[t] for t in names]) if names else np.zeros((0, store.width))
    rows_at_once = max(1, SCORE_BYTES // (8 * max(1, len(stacked))))
    chunk_bytes = min(chunk_bytes, rows_at_once * store.width * 8)
    moments, self_ = Moments(len(stacked)), np.full(n, np.nan)
    tops = {"top_train": RunningTopK(q, k), "bottom_train": RunningTopK(q, k)}
    summary = StoreSummary(self_)
    at = names.index(neighbours_of) * q if neighbours_of in names else None
    for name in ("proponents", "opponents"):
        summary.neighbours[name] = (np.full((n, min(k, q)), -1, np.int64), np.full((n, min(k, q)), np.nan))
    for rows, g in store.chunks(chunk_bytes):  # first read: self, moments, neighbours
        scores = _rounded(stacked @ g.T)
        self_[rows] = np.einsum("nd,nd->n", curvature.apply(g), g)
        moments.update(scores)
        if at is not None:
            _neighbours(summary, tops, scores[at : at + q], rows, k)
    for name, top in tops.items():
        summary.neighbours[name] = top.result(-1.0 if name == "top_train" else 1.0)
    used = moments.count > 0  # queries scored on no sample are left out, as the study does
    summary.reduced = {f"{r}_{t}": np.full(n, np.nan) for t in names for r in REDUCTIONS}
    for rows, g in store.chunks(chunk_bytes):  # second read: the reductions of the z-scores
        z = moments.standardise(_rounded(stacked @ g.T))
        for j, t in enumerate(names):
            block = slice(j * q, (j + 1) * q)
            for r, values in _reduce(z[block][used[block]], sign).items():
                summary.reduced[f"{r}_{t}"][rows] = values
    return summary


def _neighbours(summary: StoreSummary, tops: dict, scores: np.ndarray, rows: slice, k: int) -> None:
    """One chunk's (Q, rows) scores into the queries' running top-k and its samples' top-k."""
    missing = np.isnan(scores)
    largest, smallest = np.where(missing, np.inf, -scores), np.where(missing, np.inf, scores)
    tops["top_train"].update(largest, rows.start)
    tops["bottom_train"].update(smallest, rows.start)
    for name, key, sign in (("proponents", largest.T, -1.0), ("opponents", smallest.T, 1.0)):
        pick = first_k(key, k)
        values = np.take_along_axis(key, pick, 1)
        finite = np.isfinite(values)
        index, score = summary.neighbours[name]
        index[rows], score[rows] = np.where(finite, pick, -1), np.where(finite, sign * values, np.nan)


#: Default of ``influence.projection.pairwise_gb``.
PAIRWISE_GB = 2.0


def summarised(n_queries: int, n_train: int, transforms: int, pairwise_gb: float = PAIRWISE_GB) -> bool:
    """Whether the (Q, N) float32 scores of every query transform are larger than ``pairwise_gb``
    (then a job keeps the :func:`store_summary` of them instead)."""
    return n_queries > 0 and 4.0 * n_queries * n_train * transforms > pairwise_gb * 2**30
