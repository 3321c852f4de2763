"""Benchmark: the curvature engine against the reference algorithm users run today.

The reference (Garg et al.'s published loop) handles one direction at a time: it forwards x and
x + h vᵢ, backpropagates the difference of the *batch-mean* losses to get the gradient difference,
and takes the diagonal of a B×B matrix (h vᵢ)ᵀ·Δg for the directional eigenvalue. It forwards
2·n rows per sample; the engine forwards n + 1 (g(x) once), so 2n/(n+1) is the speedup to expect
from the row count alone (1.82 for n = 10). The rest comes from chunk sizes that suit the device.

Both sides use the same randomly initialised model (eval mode), inputs and directions, and the
same float32 finite difference, so their curvatures agree to rounding (~1e-7). That comparison is
meaningful only next to the floor of the float32 finite difference itself: on a ReLU network it
is good to 1e-4..1e-3 relative (pre-activations within rounding distance of a kink switch sides;
see epochlens.curvature.estimator), and ``float32_vs_float64`` reports that floor for both sides, on a few
samples, against the engine run in float64. An engine that changed the forward arithmetic would
land at that floor without being less accurate: a fused-BatchNorm, channels-last variant measured
4e-3 from the reference (and 1.1-1.4x faster per row); it was not adopted, so max_rel_diff
stays a test of the engine.

Usage (on a machine shared with other jobs, --threads 1 keeps their load out of the timings):
    .venv/bin/python benchmarks/curvature.py --model resnet18_lop --n-samples 64 --threads 1 --json
"""

from __future__ import annotations

import argparse

import _common
import numpy as np
import torch
import torch.nn.functional as F

from epochlens.curvature.estimator import (
    default_max_batch,
    full_fp32_precision,
    per_sample_curvature,
    rademacher_directions,
)
from epochlens.curvature.settings import CurvatureSettings
from epochlens.models.networks import build_model, positions_in, restrict_logits

# (in_channels, side, num_classes, active classes) of the benchmark input per model.
SHAPES = {"small_cnn": (1, 8, 10, 5), "resnet18_lop": (3, 32, 100, 50)}


def reference_curvature(
    model: torch.nn.Module,
    images: torch.Tensor,
    targets: torch.Tensor,
    active: np.ndarray,
    signs: torch.Tensor,
    h: float,
    temperature: float,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The per-direction loop as users run it: (curvature, directional_eig), both (N,).

    ``signs`` (N, n, C, H, W) are the engine's directions, so both sides see the same vᵢ.
    """
    model.eval()
    n = signs.shape[1]
    curvature, eig = [], []
    for lo in range(0, len(images), batch_size):
        x = images[lo : lo + batch_size].clone()
        y = targets[lo : lo + batch_size]
        b = len(x)
        regr = torch.zeros(b, dtype=torch.float64)
        eigs = torch.zeros(b, dtype=torch.float64)
        for i in range(n):
            v = h * signs[lo : lo + batch_size, i]
            x.requires_grad_()
            out_pos = restrict_logits(model(x + v), active)
            out_orig = restrict_logits(model(x), active)
            loss_pos = F.cross_entropy(out_pos / temperature, y)  # batch mean, as users do
            loss_orig = F.cross_entropy(out_orig / temperature, y)
            (grad_diff,) = torch.autograd.grad(loss_pos - loss_orig, x)
            flat_v, flat_d = v.reshape(b, -1), grad_diff.reshape(b, -1)
            regr += flat_d.norm(dim=1).cpu().double()
            eigs += torch.diag(flat_v @ flat_d.T).cpu().double()  # the B×B matrix users build
        # The batch-mean loss scales every gradient by 1/B; multiply by B to compare with the
        # per-sample (sum) convention of the engine. Exact for B a power of two (such as 64);
        # otherwise the scaling adds ~1e-7 relative rounding.
        curvature.append((regr / n * b).numpy())
        eig.append((eigs / n * b).numpy())
    return np.concatenate(curvature), np.concatenate(eig)


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    channels, side, num_classes, n_active = SHAPES[name]
    torch.manual_seed(args.seed)
    model = build_model(name, num_classes, channels).to(device).eval()
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.n_samples, channels, side, side, generator=gen)
    active = np.arange(n_active)
    labels = torch.randint(0, n_active, (args.n_samples,), generator=gen).numpy()
    indices = np.arange(args.n_samples)
    settings = CurvatureSettings(
        h=args.h,
        n_directions=args.n_directions,
        seed=args.seed,
        batch_size=args.batch_size,
        max_batch=args.max_batch,
    )
    max_batch = args.max_batch or default_max_batch(device, channels * side * side)

    # The reference gets the engine's directions and targets, already on the device (not timed).
    signs = rademacher_directions(args.seed, indices, images.shape[1:], args.n_directions)
    x_dev, signs_dev = images.to(device), signs.to(device)
    targets = torch.as_tensor(positions_in(labels, active), device=device)

    def run_reference() -> tuple[np.ndarray, np.ndarray]:
        with full_fp32_precision():  # the reference also runs without TF32
            return reference_curvature(model, x_dev, targets, active, signs_dev, args.h, 1.0, args.batch_size)

    def run_engine() -> dict[str, np.ndarray]:
        return per_sample_curvature(model, images, labels, indices, active, settings, device)

    times, results, memory = _common.interleaved(
        {"reference": run_reference, "engine": run_engine}, args.repeats, device, memory=True
    )

    ref_curv, ref_eig = results["reference"]
    eng = results["engine"]
    rel = np.abs(eng["curvature"] - ref_curv) / np.abs(ref_curv)
    eig_scale = np.abs(ref_eig).max()
    t_ref, t_eng = times["reference"], times["engine"]
    report = {
        "model": name,
        **_common.environment(device),
        "n_samples": args.n_samples,
        "n_directions": args.n_directions,
        "h": args.h,
        "batch_size": args.batch_size,
        "engine_max_batch": max_batch,
        "repeats": args.repeats,
        "reference_seconds": t_ref,
        "engine_seconds": t_eng,
        "reference_samples_per_s": args.n_samples / t_ref,
        "engine_samples_per_s": args.n_samples / t_eng,
        "speedup": t_ref / t_eng,
        "expected_speedup_from_row_count": 2 * args.n_directions / (args.n_directions + 1),
        "max_rel_diff": float(rel.max()),
        "median_rel_diff": float(np.median(rel)),
        # Directional eigenvalues change sign, so relative differences are meaningless near 0:
        # differences are reported relative to the largest |eig| of the batch.
        "directional_eig_max_diff_rel_to_max": float(
            np.abs(eng["directional_eig"] - ref_eig).max() / eig_scale
        ),
        "memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else "peak RSS",
        "reference_peak_memory_mib": memory["reference"],
        "engine_peak_memory_mib": memory["engine"],
    }
    if args.float64_samples > 0:
        k = min(args.float64_samples, args.n_samples)
        model64 = build_model(name, num_classes, channels).to(device)
        model64.load_state_dict(model.state_dict())
        curv64 = per_sample_curvature(
            model64.double().eval(),
            images[:k].double(),
            labels[:k],
            indices[:k],
            active,
            settings,
            device,
        )["curvature"]
        # Max relative difference of each float32 curvature from the float64 engine's.
        report["float32_vs_float64"] = {
            "samples": k,
            "engine": float(np.max(np.abs(eng["curvature"][:k] - curv64) / curv64)),
            "reference": float(np.max(np.abs(ref_curv[:k] - curv64) / curv64)),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser(__doc__)
    parser.add_argument("--n-samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch (both)")
    parser.add_argument("--n-directions", type=int, default=10)
    parser.add_argument("--h", type=float, default=1e-3)
    parser.add_argument("--max-batch", type=int, default=None, help="engine rows per pass")
    parser.add_argument(
        "--float64-samples", type=int, default=4, help="samples for the float64 floor (0: skip)"
    )
    return _common.run(parser, bench_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
