"""Benchmark: per-layer feature extraction throughput, and cold versus cached load of the features file.

For each model (randomly initialised, eval mode) on random images of its data set's shape:

* ``extract_images_per_s``: images per second of :func:`epochlens.features.extract.extract_features` over
  the default layers (block outputs) with every representation (pooled, stats, spectral with its
  default k = 8, auto method), in memory; ``extract_pooled_only_images_per_s`` the same with the
  pooled representation alone (the cost of the forward pass and the hooks).
* ``cold_seconds``: :func:`epochlens.features.extract.load_or_extract` without a file: extraction of the
  train and test splits, HDF5 write (chunked, gzip) and rename.
* ``cached_seconds``: the same call on the existing file (a cache hit: key check and open), plus
  reading every array into memory (``FeatureSet.load_all``); ``cached_read_seconds`` is that read
  alone. The file was just written, so it is read from the OS page cache: this is the cost of the
  HDF5 decode, not of a cold disk.

Timings are the fastest of ``--repeats`` runs. Usage (on a shared machine, --threads 1 keeps
other jobs' load out of the timings):
    .venv/bin/python benchmarks/features.py --json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _common
import numpy as np
import torch

from epochlens.data import Dataset
from epochlens.features.cache import load_or_extract
from epochlens.features.extract import extract_features
from epochlens.features.representations import spectral_method_for
from epochlens.features.settings import (
    FeatureSettings,
    RepresentationSettings,
)
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
    settings = FeatureSettings(dtype=args.dtype, batch_size=args.batch_size)
    images = data.normalized("train")
    layers = resolve_layers(model, None)

    extract_features(model, images[: args.batch_size], batch_size=args.batch_size, device=device)  # warm-up
    t_all, feats = _common.best_of(
        args.repeats,
        lambda: extract_features(
            model, images, settings=settings.representations, batch_size=args.batch_size, device=device
        ),
    )
    pooled = RepresentationSettings(names=("pooled",))
    t_pooled, _ = _common.best_of(
        args.repeats,
        lambda: extract_features(model, images, settings=pooled, batch_size=args.batch_size, device=device),
    )

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
        "extract_seconds": t_all,
        "extract_images_per_s": n_train / t_all,
        "extract_pooled_only_images_per_s": n_train / t_pooled,
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
    return _common.run(parser, bench_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
