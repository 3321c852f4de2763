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
import math
import warnings

import _common
import numpy as np
import torch

from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    self_influence,
)
from epochlens.models.networks import build_model

# (in_channels, side, num_classes, active classes) of the benchmark input per model.
SHAPES = {"small_cnn": (1, 8, 10, 5), "resnet18_lop": (3, 32, 100, 50)}


def bench_once(name: str, args: argparse.Namespace, device: torch.device) -> dict:
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
    t_fit, factors = _common.timed(lambda: fit_factors(model, x, y, active, settings, device=device), device)
    t_self, selfs = _common.timed(
        lambda: self_influence(model, factors, x, y, active, settings, device=device), device
    )
    t_pair, pair = _common.timed(
        lambda: pairwise_influence(model, factors, x, y, xq, yq, active, settings, device=device), device
    )
    diag = pair.diagnostics
    dims = [max(lf.in_dim, lf.out_dim) for lf in factors.layers.values()]
    finite = diag["cond"][np.isfinite(diag["cond"])]
    return {
        "model": name,
        **_common.environment(device),
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


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    """:func:`bench_once` ``--repeats`` times: each stage's fastest time."""
    runs = []
    for _ in range(args.repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if args.json else "default")
            runs.append(bench_once(name, args, device))
    report = runs[-1]
    report["repeats"] = args.repeats
    report["seconds"] = {k: min(r["seconds"][k] for r in runs) for k in report["seconds"]}
    report["train_samples_per_s"] = _rates(report["seconds"], args)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser(__doc__, repeats=1)
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-query", type=int, default=8)
    parser.add_argument("--method", choices=["ekfac", "kfac", "diagonal", "identity"], default="ekfac")
    parser.add_argument("--fisher", choices=["true", "expected", "empirical"], default="true")
    parser.add_argument("--layers", nargs="*", default=[], help="fnmatch patterns of layers (default all)")
    parser.add_argument("--batch-size", type=int, default=32, help="factor and training batches")
    parser.add_argument("--query-batch-size", type=int, default=16)
    parser.add_argument("--precondition-dtype", choices=["float64", "float32"], default="float64")
    return _common.run(parser, bench_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
