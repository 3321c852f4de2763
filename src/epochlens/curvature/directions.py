"""The estimator's directions: Rademacher vectors that are a pure function of (seed, global sample
index, direction number, element), a SplitMix64 stream keyed by (seed, index), so that any batch
size, shard or process count sees the same directions, on any device and torch version; a text
model's are on its real tokens only (:func:`token_directions`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

# SplitMix64 constants (Steele, Lea & Flood 2014; the seeding generator of xoshiro).
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def token_directions(
    seed: int,
    sample_indices: np.ndarray,
    attention_mask: torch.Tensor,
    width: int,
    n: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Rademacher directions (B, n, T, width) on each sample's real tokens, zero on its padding.

    Sample k's directions are :func:`rademacher_directions` of shape (len_k, width), len_k its
    number of real tokens (``attention_mask`` (B, T), 1 = real), placed at those positions in
    order: the same whatever the padding around them."""
    mask = torch.as_tensor(attention_mask).bool().cpu()
    out = torch.zeros(len(mask), n, mask.shape[1], width, dtype=dtype)
    for k, (index, real) in enumerate(zip(np.asarray(sample_indices), mask, strict=True)):
        length = int(real.sum())
        out[k][:, real] = rademacher_directions(seed, np.array([index]), (length, width), n, dtype)[0]
    return out


def rademacher_directions(
    seed: int,
    sample_indices: np.ndarray,
    shape: tuple[int, ...],
    n: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Rademacher directions of each sample, a pure function of (seed, sample index).

    Sample k's directions are the bits of a SplitMix64 stream seeded with
    ``mix64(k XOR mix64(seed))``: word j (j = 1, 2, ...) is ``mix64(key + j * golden_gamma)``;
    direction i takes words i*W+1 .. (i+1)*W (W = ceil(prod(shape) / 64)), least significant bit
    first, bit b -> 1 - 2b. Integer arithmetic only, so the values are identical on every machine,
    and the first n directions do not depend on how many more are asked for.

    Args:
        seed: any Python int (taken modulo 2**64).
        sample_indices: (B,) non-negative global indices of the samples.
        shape: shape of one sample, e.g. (C, H, W).
        n: directions per sample.
        dtype: dtype of the returned tensor (int8 is the cheapest to move to a device).

    Returns:
        CPU tensor (B, n, *shape) with entries ±1.
    """
    idx = np.asarray(sample_indices)
    if idx.ndim != 1 or (idx.size and (not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0)):
        raise ValueError("sample_indices must be a 1-D array of non-negative integers")
    numel = math.prod(shape)
    words_per_dir = -(-numel // 64)
    seed_key = _mix64(np.array([seed % 2**64], dtype=np.uint64))
    keys = _mix64(idx.astype(np.uint64) ^ seed_key)  # (B,)
    counters = np.arange(1, n * words_per_dir + 1, dtype=np.uint64) * _GAMMA
    words = _mix64(keys[:, None] + counters[None, :])  # (B, n*W)
    bits = np.unpackbits(words.astype("<u8").view(np.uint8), axis=1, bitorder="little")
    bits = bits.reshape(len(idx), n, words_per_dir * 64)[:, :, :numel]
    signs = torch.from_numpy(1 - 2 * bits.astype(np.int8))
    return signs.reshape(len(idx), n, *shape).to(dtype)
