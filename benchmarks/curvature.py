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
import ctypes
import json
import math
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from epochlens.curvature.estimator import (  # noqa: E402
    default_max_batch,
    full_fp32_precision,
    per_sample_curvature,
    rademacher_directions,
)
from epochlens.curvature.settings import CurvatureSettings  # noqa: E402
from epochlens.device import resolve_device  # noqa: E402
from epochlens.models.networks import build_model, positions_in, restrict_logits  # noqa: E402

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


class PeakMemory:
    """Peak memory of a block: CUDA allocator peak, or the process's peak RSS on the CPU.

    On Linux the kernel's RSS high-water mark is reset through /proc/self/clear_refs; elsewhere a
    thread samples the RSS every 2 ms. Reported as the increase over the RSS at entry (MiB). Memory
    that the allocator kept from an earlier run would hide the next run's allocations, so glibc
    hands free memory back to the kernel first (malloc_trim).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mib = math.nan

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        _malloc_trim()
        self._base = _rss_bytes()
        self._hwm = _reset_hwm()
        if not self._hwm:
            self._stop = threading.Event()
            self._sampled = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._sampled = max(self._sampled, _rss_bytes())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self._hwm:
            peak = _status_kib("VmHWM") * 1024
        else:
            self._stop.set()
            self._thread.join()
            peak = self._sampled
        self.peak_mib = (peak - self._base) / 2**20


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _rss_bytes() -> int:
    try:
        return _status_kib("VmRSS") * 1024
    except (OSError, KeyError):
        import psutil  # not a dependency: only where /proc is missing

        return psutil.Process().memory_info().rss


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

    times: dict[str, list[float]] = {"reference": [], "engine": []}
    memory = {"reference": 0.0, "engine": 0.0}
    results: dict[str, object] = {}
    for rep in range(args.repeats):
        # Alternate the order so that neither side always runs on a warmer machine.
        order = ("reference", "engine") if rep % 2 == 0 else ("engine", "reference")
        for side_name in order:
            fn = run_reference if side_name == "reference" else run_engine
            with PeakMemory(device) as mem:
                _sync(device)
                t0 = time.perf_counter()
                results[side_name] = fn()
                _sync(device)
                times[side_name].append(time.perf_counter() - t0)
            memory[side_name] = max(memory[side_name], mem.peak_mib)

    ref_curv, ref_eig = results["reference"]
    eng = results["engine"]
    rel = np.abs(eng["curvature"] - ref_curv) / np.abs(ref_curv)
    eig_scale = np.abs(ref_eig).max()
    t_ref, t_eng = min(times["reference"]), min(times["engine"])
    report = {
        "model": name,
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
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
    parser.add_argument("--n-samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch (both)")
    parser.add_argument("--n-directions", type=int, default=10)
    parser.add_argument("--h", type=float, default=1e-3)
    parser.add_argument("--max-batch", type=int, default=None, help="engine rows per pass")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="timings: the fastest repeat")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--float64-samples", type=int, default=4, help="samples for the float64 floor (0: skip)"
    )
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
