"""Benchmark: per-layer feature extraction throughput, and cold versus cached load of the features file.

For each model (randomly initialised, eval mode) on random images of its data set's shape:

* ``extract_images_per_s``: images per second of :func:`epochlens.features.extract.extract_features` over
  the default layers (block outputs) with every representation (pooled, stats, spectral with its
  default k = 8, auto method), in memory; ``extract_pooled_only_images_per_s`` the same with the
  pooled representation alone (the cost of the forward pass and the hooks); ``all_over_pooled`` the
  ratio of their times (what the extra representations cost, 1.0 = nothing).
* ``per_representation``: the same extraction with pooled plus one other representation
  (``pooled+stats``, ``pooled+spectral``), images per second and time over pooled alone: where the
  extra cost of ``all`` comes from (the forward pass and the hooks are shared). The four sides run
  interleaved (A B C D, D C B A, ...), and each keeps its fastest repeat, so that a shared machine's
  load falls on all of them alike. ``all_over_pooled_cpu_time`` and ``cpu_time_over_pooled``: the
  same ratios of the process's CPU time (every thread; the fastest repeat), which other jobs'
  load disturbs less than the wall clock (a thread that waits for a core is not charged).
* ``precision``: the forward pass's precision (``--precision``: float32, or autocast to bfloat16 /
  float16 as ``features.precision`` does); with a 16-bit one, ``precision_max_rel_diff`` is the
  largest difference of every stored value from a float32 forward's, relative to the largest
  value of its layer and representation (pooled, stats and spectral of the first batch).
* ``cold_seconds``: :func:`epochlens.features.extract.load_or_extract` without a file: extraction of the
  train and test splits, HDF5 write (chunked, gzip) and rename.
* ``cached_seconds``: the same call on the existing file (a cache hit: key check and open), plus
  reading every array into memory (``FeatureSet.load_all``); ``cached_read_seconds`` is that read
  alone. The file was just written, so it is read from the OS page cache: this is the cost of the
  HDF5 decode, not of a cold disk.

Timings are the fastest of ``--repeats`` runs. Usage (on a shared machine, --threads 1 or 2 keeps
other jobs' load out of the timings):
    .venv/bin/python benchmarks/features.py --model resnet18_lop --n-samples 128 --repeats 3 --threads 2
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import _common
import numpy as np
import torch

from epochlens.data import Dataset
from epochlens.features.cache import load_or_extract
from epochlens.features.extract import extract_features
from epochlens.features.settings import (
    FeatureSettings,
    RepresentationSettings,
)
from epochlens.features.spectral import spectral_method_for
from epochlens.models.layers import resolve_layers
from epochlens.models.networks import build_model

# (in_channels, side, num_classes, default train images) per model; test split = train / 4.
SHAPES = {"small_cnn": (1, 8, 10, 4096), "resnet18_lop": (3, 32, 100, 512)}


def random_dataset(channels: int, side: int, num_classes: int, n_train: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    n_test = max(1, n_train // 4)
    return Dataset(
        name="random",
        source="benchmark",
        train_images=rng.integers(0, 256, (n_train, channels, side, side), dtype=np.uint8),
        train_labels=rng.integers(0, num_classes, n_train),
        test_images=rng.integers(0, 256, (n_test, channels, side, side), dtype=np.uint8),
        test_labels=rng.integers(0, num_classes, n_test),
        num_classes=num_classes,
        scale=1 / 255,
        mean=(0.5,) * channels,
        std=(0.25,) * channels,
    )


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    channels, side, num_classes, default_n = SHAPES[name]
    n_train = args.n_samples or default_n
    torch.manual_seed(args.seed)
    model = build_model(name, num_classes, channels).eval()
    data = random_dataset(channels, side, num_classes, n_train, args.seed)
    settings = FeatureSettings(dtype=args.dtype, batch_size=args.batch_size, precision=args.precision)
    images = data.normalized("train")
    layers = resolve_layers(model, None)

    def extract(names: tuple[str, ...]) -> Callable[[], dict]:
        reps = RepresentationSettings(**{**asdict(settings.representations), "names": names})
        return lambda: extract_features(
            model, images, settings=reps, batch_size=args.batch_size, device=device, precision=args.precision
        )

    sides = {
        "all": extract(settings.representations.names),
        "pooled": extract(("pooled",)),
        "pooled+stats": extract(("pooled", "stats")),
        "pooled+spectral": extract(("pooled", "spectral")),
    }
    cpu = {name: math.inf for name in sides}

    def with_cpu_time(name: str, fn: Callable[[], dict]) -> Callable[[], dict]:
        def run() -> dict:
            t0 = time.process_time()
            out = fn()
            cpu[name] = min(cpu[name], time.process_time() - t0)
            return out

        return run

    for fn in sides.values():  # warm-up
        fn()
    times, results, _ = _common.interleaved(
        {name: with_cpu_time(name, fn) for name, fn in sides.items()}, args.repeats, device
    )
    feats = results["all"]
    precision_diff = None
    if args.precision != "float32":
        first = images[: args.batch_size]
        ref = extract_features(model, first, batch_size=args.batch_size, device=device)
        low = extract_features(
            model, first, batch_size=args.batch_size, device=device, precision=args.precision
        )
        precision_diff = {
            layer: {
                r: float(np.abs(low[layer][r] - a).max() / max(np.abs(a).max(), 1e-30))
                for r, a in by_rep.items()
            }
            for layer, by_rep in ref.items()
        }
    cold, cached, read = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            path = Path(tmp) / f"epoch_{rep:04d}.h5"
            t0 = time.perf_counter()
            first = load_or_extract(path, model, data, "0" * 64, settings, device)
            cold.append(time.perf_counter() - t0)
            assert not first.hit
            t0 = time.perf_counter()
            second = load_or_extract(path, model, data, "0" * 64, settings, device)
            t1 = time.perf_counter()
            second.features.load_all()
            t2 = time.perf_counter()
            assert second.hit
            cached.append(t2 - t0)
            read.append(t2 - t1)
            size = path.stat().st_size
            shapes = {layer: second.features.shape(layer) for layer in layers}
    n_total = n_train + len(data.test_labels)
    if not args.json:
        over = {side: t / times["pooled"] for side, t in times.items()}
        print(
            f"{name}: all/pooled {over['all']:.3f} (pooled+stats {over['pooled+stats']:.3f}, pooled+spectral "
            f"{over['pooled+spectral']:.3f}; CPU time {cpu['all'] / cpu['pooled']:.3f}), "
            f"{n_train / times['all']:.1f} vs {n_train / times['pooled']:.1f} images/s",
            file=sys.stderr,
        )
    return {
        "model": name,
        **_common.environment(device),
        "input_shape": [channels, side, side],
        "layers": layers,
        "activation_shapes": {layer: list(shapes[layer]) for layer in layers},
        "spectral_method": {
            layer: spectral_method_for(shapes[layer], settings.representations) for layer in layers
        },
        "feature_dims": {layer: {r: int(a.shape[1]) for r, a in feats[layer].items()} for layer in layers},
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "extract_images": n_train,
        "precision": args.precision,
        "extract_seconds": times["all"],
        "extract_images_per_s": n_train / times["all"],
        "extract_pooled_only_images_per_s": n_train / times["pooled"],
        "all_over_pooled": times["all"] / times["pooled"],
        "all_over_pooled_cpu_time": cpu["all"] / cpu["pooled"],
        "per_representation": {
            side: {
                "images_per_s": n_train / t,
                "over_pooled": t / times["pooled"],
                "cpu_time_over_pooled": cpu[side] / cpu["pooled"],
            }
            for side, t in times.items()
            if side != "pooled"
        },
        "precision_max_rel_diff": precision_diff,
        "file_images": n_total,
        "file_mib": size / 2**20,
        "cold_seconds": min(cold),
        "cold_images_per_s": n_total / min(cold),
        "cached_seconds": min(cached),
        "cached_read_seconds": min(read),
        "cold_over_cached": min(cold) / min(cached),
    }


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser(__doc__)
    parser.add_argument("--n-samples", type=int, default=None, help="train images (default per model)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument(
        "--precision", choices=["float32", "bfloat16", "float16"], default="float32", help="forward pass"
    )
    return _common.run(parser, bench_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
