"""Per-sample random draws (SplitMix64), pure functions of (seed, global sample index, draw
number), so results do not depend on batching or sharding.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_LABEL_STREAM = np.uint64(0x1F1F1F1F)  # separates this use of the seed from others


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def sample_uniforms(seed: int, sample_indices: np.ndarray, count: int | None = None) -> np.ndarray:
    """Uniforms in [0, 1), pure functions of (seed, global sample index, draw j) (SplitMix64).

    Returns:
        (B,) with ``count`` None (draw 0), else (B, count) float64.
    """
    idx = np.asarray(sample_indices).astype(np.uint64)
    k = 1 if count is None else int(count)
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed % 2**64], dtype=np.uint64) ^ _LABEL_STREAM)
        base = _mix64(idx ^ key)[:, None]
        steps = (np.arange(1, k + 1, dtype=np.uint64) * _GAMMA)[None, :]
        words = _mix64(base + steps)
    u = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return u[:, 0] if count is None else u


class Uniforms:
    """``uniforms(k)`` -> (B, k) float64 uniforms in [0, 1) on ``device`` for a batch's samples.

    Each call starts after the draws of the previous ones, so a task may ask several times.
    """

    def __init__(self, seed: int, sample_indices: np.ndarray, device: torch.device | str = "cpu") -> None:
        self.seed, self.indices, self.device, self._used = seed, np.asarray(sample_indices), device, 0

    def __call__(self, k: int) -> torch.Tensor:
        u = sample_uniforms(self.seed, self.indices, self._used + k)[:, self._used :]
        self._used += k
        return torch.as_tensor(u, device=self.device)

    def normal(self, k: int) -> torch.Tensor:
        """(B, k) standard normal draws (Box-Muller on two uniforms each)."""
        u = self(2 * k)
        u1, u2 = 1.0 - u[:, :k], u[:, k:]  # u1 in (0, 1]: log is finite
        return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
