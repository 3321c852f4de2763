"""Benchmark: the memory and time of the normalisation statistics (``epochlens.data.stats``) of N
CIFAR-shaped uint8 images, as ``prepare_data`` computes them for an image folder or an ``.npz``:
the whole array in float64 at once (as before; 8 bytes a value) against a block at a time (now,
above ``WHOLE_VALUES``). Each in a process of its own, interleaved A B A B, the best of each kept;
peak = the process's ru_maxrss less the images' own bytes.

    .venv/bin/python benchmarks/normalisation_stats.py --n 200000 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, time, numpy as np
from epochlens.data import stats
images = np.random.default_rng(0).integers(0, 256, ({n}, 3, 32, 32), dtype=np.uint8)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
if "{mode}" == "whole":
    stats.WHOLE_VALUES = images.size  # the whole array at once, as before
t = time.perf_counter()
mean, std = stats.channel_stats(images, 1 / 255)
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
print(json.dumps({{"mode": "{mode}", "seconds": seconds, "extra_mb": peak - base, "mean": mean, "std": std}}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for mode in ("whole", "blocks"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD.format(n=args.n, mode=mode)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout)
            if mode not in best or row["seconds"] < best[mode]["seconds"]:
                best[mode] = row
    whole, blocks = best["whole"], best["blocks"]
    for row in (whole, blocks):
        print(f"{row['mode']:<7} {row['seconds']:7.2f} s  {row['extra_mb']:8.0f} MB above the images")
    ratio = blocks["extra_mb"] / whole["extra_mb"]
    diff = max(
        abs(a - b) / abs(a)
        for a, b in zip(whole["std"] + whole["mean"], blocks["std"] + blocks["mean"], strict=True)
    )
    print(
        f"N = {args.n:,}: blocks/whole memory {ratio:.3f}, time {blocks['seconds'] / whole['seconds']:.2f}x"
    )
    print(f"largest relative difference of the statistics {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
