"""A job's share of a data set: shard k of S is a contiguous range of sample positions
(torch-free; curvature's and the sample outputs' shard jobs split their samples so)."""

from __future__ import annotations


def shard_range(n_samples: int, shard: int, nshards: int) -> tuple[int, int]:
    """Sample range [lo, hi) of shard ``shard`` (0-based) of ``nshards``: contiguous, sizes differ by ≤ 1."""
    if nshards < 1 or not 0 <= shard < nshards:
        raise ValueError(f"shard {shard} of {nshards}: need 0 <= shard < nshards")
    base, extra = divmod(n_samples, nshards)
    lo = shard * base + min(shard, extra)
    return lo, lo + base + (shard < extra)
