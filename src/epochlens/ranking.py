"""Exact top-k of each row, NumPy only: the dossier's neighbours (:mod:`epochlens.samples.neighbours`)
and the gradient store's summary (:mod:`epochlens.influence.store_summary`) rank alike."""

from __future__ import annotations

import numpy as np


def first_k(key: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``key`` (R, C): the columns of its k smallest keys in order, ties to the lower
    column (a stable argsort's first k), from a partition; rows with ties across a finite k-th key
    are sorted alone (the order among infinite keys is left as the partition gives it)."""
    k = min(k, key.shape[1])
    if k == 0:
        return np.zeros((len(key), 0), np.int64)
    if k == key.shape[1]:
        return np.argsort(key, axis=1, kind="stable")
    part = np.argpartition(key, k - 1, axis=1)[:, :k]
    picked = np.take_along_axis(key, part, 1)
    kth = picked.max(1, keepdims=True)
    order = np.take_along_axis(part, np.lexsort((part, picked), axis=1), 1)
    # ties straddle a finite k-th key: that row alone (ties at inf are left out as not finite)
    for r in np.flatnonzero(((key <= kth).sum(1) > k) & np.isfinite(kth[:, 0])):
        candidates = np.flatnonzero(key[r] <= kth[r])
        order[r] = candidates[np.argsort(key[r, candidates], kind="stable")][:k]
    return order
