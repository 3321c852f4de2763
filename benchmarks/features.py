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
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from epochlens.data import Dataset  # noqa: E402
from epochlens.device import resolve_device  # noqa: E402
from epochlens.features.cache import load_or_extract  # noqa: E402
from epochlens.features.extract import extract_features  # noqa: E402
from epochlens.features.representations import spectral_method_for  # noqa: E402
from epochlens.features.settings import (
    FeatureSettings,  # noqa: E402
    RepresentationSettings,  # noqa: E402
)
from epochlens.models.layers import resolve_layers  # noqa: E402
from epochlens.models.networks import build_model  # noqa: E402

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


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


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
    t_all, feats = best_of(
        args.repeats,
        lambda: extract_features(
            model, images, settings=settings.representations, batch_size=args.batch_size, device=device
        ),
    )
    pooled = RepresentationSettings(names=("pooled",))
    t_pooled, _ = best_of(
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
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
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


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["small_cnn", "resnet18_lop", "both"], default="both")
    parser.add_argument("--n-samples", type=int, default=None, help="train images (default per model)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="timings: the fastest repeat")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    names = ["small_cnn", "resnet18_lop"] if args.model == "both" else [args.model]
    reports = {}
    for name in names:
        if not args.json:
            print(f"benchmarking {name} on {device} ...", file=sys.stderr, flush=True)
        reports[name] = bench_model(name, args, device)
    print(json.dumps(reports[names[0]] if len(names) == 1 else reports, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
