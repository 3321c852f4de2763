"""Benchmark: time per stage of the influence engine on the digits SmallCNN and the LoP ResNet-18.

Stages: covariances (one forward/backward pass over the training samples, float64 sums),
eigendecomposition (of every layer's A and S), corrections (EK-FAC's second pass, or the diagonal),
self-influence (one pass) and pairwise influence (ceil(Q / query_batch_size) passes over the
training samples). Inputs are random (N(0, 1)) at the models' native sizes: 1x8x8 for SmallCNN
(10 classes, 5 active), 3x32x32 for ResNet-18 (100 classes, 50 active); weights are the models'
random initialisation. Eigendecomposition time does not depend on the number of samples; on
ResNet-18 it is dominated by the 4609x4609 activation covariances of layer4 (512 channels x 3x3
patches + bias).

Usage (on a machine shared with other jobs, --threads 1 keeps their load out of the timings):
    .venv/bin/python benchmarks/influence.py --model small_cnn --n-train 256 --n-query 16 --json
    .venv/bin/python benchmarks/influence.py --model resnet18_lop --n-train 16 --n-query 4 --json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from epochlens.device import resolve_device  # noqa: E402
from epochlens.influence import (  # noqa: E402
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    self_influence,
)
from epochlens.models.networks import build_model  # noqa: E402

# (in_channels, side, num_classes, active classes) of the benchmark input per model.
SHAPES = {"small_cnn": (1, 8, 10, 5), "resnet18_lop": (3, 32, 100, 50)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    channels, side, num_classes, n_active = SHAPES[name]
    torch.manual_seed(args.seed)
    model = build_model(name, num_classes, channels).to(device).eval()
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n_train, channels, side, side, generator=gen)
    xq = torch.randn(args.n_query, channels, side, side, generator=gen)
    active = np.arange(n_active)
    y = torch.randint(0, n_active, (args.n_train,), generator=gen).numpy()
    yq = torch.randint(0, n_active, (args.n_query,), generator=gen).numpy()
    settings = InfluenceSettings(
        method=args.method,
        fisher=args.fisher,
        layers=tuple(args.layers),
        factor_batch_size=args.batch_size,
        train_batch_size=args.batch_size,
        query_batch_size=args.query_batch_size,
        precondition_dtype=args.precondition_dtype,
    )
    _sync(device)
    t0 = time.perf_counter()
    factors = fit_factors(model, x, y, active, settings, device=device)
    _sync(device)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    selfs = self_influence(model, factors, x, y, active, settings, device=device)
    _sync(device)
    t_self = time.perf_counter() - t0
    t0 = time.perf_counter()
    pair = pairwise_influence(model, factors, x, y, xq, yq, active, settings, device=device)
    _sync(device)
    t_pair = time.perf_counter() - t0
    diag = pair.diagnostics
    dims = [max(lf.in_dim, lf.out_dim) for lf in factors.layers.values()]
    finite = diag["cond"][np.isfinite(diag["cond"])]
    return {
        "model": name,
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "method": args.method,
        "fisher": args.fisher,
        "n_train": args.n_train,
        "n_query": args.n_query,
        "batch_size": args.batch_size,
        "query_batch_size": args.query_batch_size,
        "precondition_dtype": args.precondition_dtype,
        "layers_tracked": len(factors.layers),
        "params_tracked": int(sum(lf.out_dim * lf.in_dim for lf in factors.layers.values())),
        "largest_factor_dim": max(dims),
        "seconds": {
            **{k: round(v, 3) for k, v in factors.timings.items()},
            "fit_total": round(t_fit, 3),
            "self_influence": round(t_self, 3),
            "pairwise": round(t_pair, 3),
        },
        "max_cond": float(finite.max()) if len(finite) else None,
        "damping_steps_total": int(diag["damping_steps"].sum()),
        "eigen_fallbacks": int(diag["solver"].str.contains("<-").sum()),
        "skipped_samples": int(len(selfs.skipped)),
        "scores_finite": bool(np.isfinite(selfs.scores).all() and np.isfinite(pair.scores).all()),
    }


def _rates(seconds: dict, args: argparse.Namespace) -> dict:
    """Training samples per second of the passes over the data (pairwise: sample-query pairs)."""
    return {
        "covariances": round(args.n_train / seconds.get("covariances", math.nan), 2),
        "self_influence": round(args.n_train / seconds["self_influence"], 2),
        "pairwise_pairs": round(args.n_train * args.n_query / seconds["pairwise"], 2),
    }


def _load_average() -> float | None:
    """1-minute load average: other jobs on a shared machine slow every stage."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["small_cnn", "resnet18_lop", "both"], default="both")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-query", type=int, default=8)
    parser.add_argument("--method", choices=["ekfac", "kfac", "diagonal", "identity"], default="ekfac")
    parser.add_argument("--fisher", choices=["true", "expected", "empirical"], default="true")
    parser.add_argument("--layers", nargs="*", default=[], help="fnmatch patterns of layers (default all)")
    parser.add_argument("--batch-size", type=int, default=32, help="factor and training batches")
    parser.add_argument("--query-batch-size", type=int, default=16)
    parser.add_argument("--precondition-dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=1, help="timings: the fastest repeat per stage")
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
        runs = []
        for _ in range(args.repeats):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore" if args.json else "default")
                runs.append(bench_model(name, args, device))
        report = runs[-1]
        report["repeats"] = args.repeats
        report["seconds"] = {k: min(r["seconds"][k] for r in runs) for k in report["seconds"]}
        report["train_samples_per_s"] = _rates(report["seconds"], args)
        report["load_average_1min"] = _load_average()
        reports[name] = report
    print(json.dumps(reports[names[0]] if len(names) == 1 else reports, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
