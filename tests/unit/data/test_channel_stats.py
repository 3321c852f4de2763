"""epochlens.data.stats: the normalisation statistics, whole or a block of rows at a time."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from epochlens.data import stats
from epochlens.data.stats import channel_stats


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_blocks_agree_with_the_whole_array(monkeypatch, dtype):
    """Forced through blocks of 700 values (rows of 3 x 4 x 5 = 60: 11 rows a block, a short last
    block), the statistics equal numpy's over the whole float64 array to rounding."""
    rng = np.random.default_rng(0)
    images = (rng.integers(0, 256, (101, 3, 4, 5)) * np.array([1, 0.5, 0.1]).reshape(1, 3, 1, 1)).astype(
        dtype
    )
    whole = channel_stats(images, 1 / 255)
    monkeypatch.setattr(stats, "WHOLE_VALUES", 700)
    monkeypatch.setattr(stats, "BLOCK_VALUES", 700)
    blocks = channel_stats(images, 1 / 255)
    np.testing.assert_allclose(blocks, whole, rtol=1e-13)
    x = images.astype(np.float64) / 255
    np.testing.assert_allclose(blocks[0], x.mean(axis=(0, 2, 3)), rtol=1e-13)
    np.testing.assert_allclose(blocks[1], x.std(axis=(0, 2, 3)), rtol=1e-13)


def test_a_constant_channel_has_unit_std_in_blocks_too(monkeypatch):
    images = np.full((50, 2, 3, 3), 7, np.uint8)
    images[:, 1] = np.arange(50, dtype=np.uint8)[:, None, None]
    monkeypatch.setattr(stats, "WHOLE_VALUES", 100)
    monkeypatch.setattr(stats, "BLOCK_VALUES", 100)
    mean, std = channel_stats(images, 0.5)
    assert mean[0] == 3.5 and std[0] == 1.0
    assert mean[1] == pytest.approx(0.5 * 24.5) and std[1] == pytest.approx(0.5 * np.arange(50).std())


def test_memory_is_a_block_not_the_float64_of_the_whole(monkeypatch):
    """Images of 4,000 float64 blocks: numpy's allocations stay within a few blocks (the whole
    array in float64 at once, as before, takes 8 bytes a value)."""
    monkeypatch.setattr(stats, "WHOLE_VALUES", 1 << 16)
    monkeypatch.setattr(stats, "BLOCK_VALUES", 1 << 16)
    images = np.random.default_rng(1).integers(0, 256, (4096, 3, 32, 32), dtype=np.uint8)
    tracemalloc.start()
    try:
        channel_stats(images, 1 / 255)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 8 * stats.BLOCK_VALUES < images.size * 8 / 10


@pytest.mark.parametrize("axes", [(2, 0, 1), (0, 1, 2), (1, 2, 0)])
def test_batch_like_is_laid_out_as_a_stack(axes):
    """Images filled into batch_like have np.stack's strides (and so the same statistics, to the
    bit), for an image that is a transposed view (as decoded: HWC memory seen as CHW) or not."""
    rng = np.random.default_rng(2)
    images = [np.transpose(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), axes) for _ in range(7)]
    batch = stats.batch_like(len(images), images[0])
    for row, image in enumerate(images):
        batch[row] = image
    stacked = np.stack(images)
    assert batch.strides == stacked.strides and np.array_equal(batch, stacked)
    assert channel_stats(batch, 1 / 255) == channel_stats(stacked, 1 / 255)
