"""The inputs' normalisation statistics: per-channel mean and std of the training images.

Up to :data:`WHOLE_VALUES` values the whole array is converted to float64 at once, as it always
was (the statistics of such data sets are unchanged to the bit); above, a block of rows at a time
in two passes (the sum, then the squared deviations from the mean), :data:`BLOCK_VALUES` at a
time, so that a million CIFAR images (3 GB of uint8, 25 GB in float64) take about 200 MB more,
not 25 GB. The two agree to rounding
(about 1e-15 relative).
"""

from __future__ import annotations

import math

import numpy as np

#: Values converted to float64 at once: 256 MB (about 11,000 CIFAR images).
WHOLE_VALUES = 1 << 25
#: Values converted to float64 at a time above it: 64 MB (2,730 CIFAR images).
BLOCK_VALUES = 1 << 23


def channel_stats(images: np.ndarray, scale: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std (ddof 0) of ``images * scale`` (N, C, H, W) (any (N, C, ...):
    over every axis but 1); a channel of one value gets std 1."""
    axes = (0, *range(2, images.ndim))
    if images.size <= WHOLE_VALUES:
        x = images.astype(np.float64) * scale
        mean, std = x.mean(axis=axes), x.std(axis=axes)
    else:
        mean, std = _blockwise(images, scale, axes)
    std[std == 0] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _blockwise(images: np.ndarray, scale: float, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`channel_stats`'s mean and std, reading :data:`BLOCK_VALUES` values at a time."""
    rows = max(1, BLOCK_VALUES // max(1, math.prod(images.shape[1:])))
    count = images.size // images.shape[1]
    blocks = [slice(lo, lo + rows) for lo in range(0, len(images), rows)]
    total = sum((images[b].astype(np.float64) * scale).sum(axis=axes) for b in blocks)
    mean = total / count
    centre = mean.reshape(1, -1, *[1] * (images.ndim - 2))
    squares = sum((np.square(images[b].astype(np.float64) * scale - centre)).sum(axis=axes) for b in blocks)
    return mean, np.sqrt(squares / count)


def batch_like(n: int, array: np.ndarray) -> np.ndarray:
    """An empty (n, *array.shape) laid out in memory as ``np.stack`` of n such arrays would be (an
    image's own axis order): filled row by row, it holds the images once instead of a list and its
    stack, and :func:`channel_stats` adds its values in the same order as it did the stack's."""
    order = sorted(range(array.ndim), key=lambda axis: -array.strides[axis])  # slowest first
    batch = np.empty((n, *[array.shape[axis] for axis in order]), array.dtype)
    return batch.transpose(0, *[1 + order.index(axis) for axis in range(array.ndim)])
