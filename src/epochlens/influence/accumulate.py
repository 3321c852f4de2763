"""Scores computed per checkpoint, summed (TracIn's sum over checkpoints) where each is finite.
NumPy only: the study's detection tables use it without torch.
"""

from __future__ import annotations

import numpy as np


def accumulate_tracin(parts: list[np.ndarray], weights: list[float] | None = None) -> np.ndarray:
    """Σ_k w_k parts[k] where each entry counts only at the checkpoints where it is finite.

    In a class-incremental run an image (or a query's label) is not trained before its class is
    added: its score at those checkpoints is NaN and contributes nothing, as in TracIn's sum over
    the steps that trained on it. Entries NaN at every checkpoint stay NaN.
    """
    if not parts:
        raise ValueError("TracIn needs at least one checkpoint")
    weights = [1.0] * len(parts) if weights is None else list(weights)
    stack = np.stack([np.asarray(p, np.float64) * w for p, w in zip(parts, weights, strict=True)])
    finite = np.isfinite(stack)
    total = np.where(finite, stack, 0.0).sum(0)
    return np.where(finite.any(0), total, np.nan)
