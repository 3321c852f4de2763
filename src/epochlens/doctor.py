"""``epochlens doctor``: can this machine run the pipeline, and on which device?

Checks, each with a status (ok / warn / fail) and a one-line detail:

* versions of Python, torch and the packages the workflow imports (missing ones fail);
* the device ``auto`` resolves to (CUDA, then MPS, then CPU), its name and memory;
* which dtypes work there (a small matmul in float32, float64, float16, bfloat16), and whether
  forward passes autocast to the 16-bit ones there (``ablation.precision``,
  ``features.precision``); float64 missing (MPS) is a warning: float64 work falls back to the CPU;
* a short curvature run (small CNN, random 8x8 images) on the device, compared with the same
  computation in float64 on the CPU, with its throughput;
* with a profile (``epochlens doctor --profile profiles/slurm``), which device each rule's jobs
  use under it, and whether the config's device can work there (:mod:`epochlens.rule_devices`).

The verdict is "ready" when nothing failed; the CLI exits 1 otherwise.
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from epochlens.curvature.estimator import per_sample_curvature
from epochlens.curvature.settings import CurvatureSettings
from epochlens.device import autocast, device_for_dtype, resolve_device, supports_float64
from epochlens.errors import EpochlensError
from epochlens.models.networks import SmallCNN
from epochlens.resources import PRECISIONS

#: Packages the workflow imports (distribution names).
REQUIRED = (
    "torch",
    "numpy",
    "h5py",
    "pandas",
    "matplotlib",
    "scikit-learn",
    "scipy",
    "snakemake",
    "tqdm",
    # your own model and data (README: "Your own model")
    "pillow",
    "safetensors",
    "transformers",
    "datasets",
)
#: Largest relative difference from the float64 CPU reference that counts as agreement in float32.
FLOAT32_TOLERANCE = 1e-3


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str


def _versions() -> list[Check]:
    checks = [Check("python", "ok", platform.python_version())]
    for dist in REQUIRED:
        try:
            checks.append(Check(dist, "ok", importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            checks.append(Check(dist, "fail", "not installed: pip install -e . in the project folder"))
    return checks


def _device_check(device: torch.device) -> Check:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        detail = (
            f"{props.name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free), "
            f"{torch.cuda.device_count()} visible, CUDA {torch.version.cuda}"
        )
    elif device.type == "mps":
        detail = f"Apple MPS ({platform.machine()})"
    else:
        detail = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"
    return Check("device", "ok", f"{device}: {detail}")


def _dtype_checks(device: torch.device) -> list[Check]:
    checks = []
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        if dtype == torch.float64 and not supports_float64(device):
            checks.append(Check(name, "warn", f"not on {device.type}: float64 work runs on the CPU"))
            continue
        try:
            a = torch.ones(8, 8, dtype=dtype, device=device)
            ok = float((a @ a).sum().item()) == 512.0
            detail = "matmul" if ok else "wrong matmul result"
            if ok and name in PRECISIONS[1:]:
                detail += _autocast_check(device, name)
            checks.append(Check(name, "ok" if ok else "fail", detail))
        except (RuntimeError, TypeError) as exc:
            status = "fail" if dtype == torch.float32 else "warn"
            checks.append(Check(name, status, f"unsupported: {str(exc).splitlines()[0]}"))
    return checks


def _autocast_check(device: torch.device, name: str) -> str:
    """Whether forward passes autocast to ``name`` on ``device`` (ablation.precision, features.precision)."""
    layer = torch.nn.Linear(8, 8).to(device)
    try:
        with autocast(device, name):
            out = layer(torch.ones(2, 8, device=device))
    except (RuntimeError, EpochlensError) as exc:
        return f"; no autocast ({str(exc).splitlines()[0]}): ablation/features.precision float32 only"
    if out.dtype != getattr(torch, name):
        return f"; autocast gave {out.dtype}: ablation/features.precision float32 only"
    return f"; autocast works (ablation/features.precision: {name})"


def _curvature_check(device: torch.device, n_samples: int = 32) -> Check:
    torch.manual_seed(0)
    model = SmallCNN(num_classes=10, in_channels=1)
    images = torch.randn(n_samples, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = np.arange(n_samples) % 10
    indices = np.arange(n_samples)
    active = np.arange(10)
    settings = CurvatureSettings(mode="exact", n_directions=4)  # smooth in h: comparable across dtypes
    try:
        per_sample_curvature(model, images[:2], labels[:2], indices[:2], active, settings, device)  # warm-up
        start = time.perf_counter()
        got = per_sample_curvature(model, images, labels, indices, active, settings, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        ref = per_sample_curvature(
            model.double(),
            images.double(),
            labels,
            indices,
            active,
            settings,
            device_for_dtype(device, torch.float64),
        )
    except (RuntimeError, EpochlensError) as exc:
        return Check("curvature", "fail", f"short run failed: {str(exc).splitlines()[0]}")
    rel = float(np.max(np.abs(got["curvature"] - ref["curvature"]) / np.abs(ref["curvature"])))
    status = "ok" if rel <= FLOAT32_TOLERANCE else "fail"
    return Check(
        "curvature",
        status,
        f"{n_samples / elapsed:.0f} samples/s (small CNN, 8x8, 4 directions); max relative "
        f"difference from float64 {rel:.1e} (limit {FLOAT32_TOLERANCE:g})",
    )


def run_doctor(
    device: str = "auto", plan_checks: Iterable[tuple[str, str, str]] = ()
) -> tuple[list[Check], str]:
    """All checks on ``device`` and the verdict line; ``plan_checks``: ``(name, status, detail)``
    of the rules' devices under a profile (epochlens.rule_devices.plan_checks), counted in the
    verdict."""
    checks = [Check(*c) for c in plan_checks] + _versions()
    try:
        dev = resolve_device(device)
    except EpochlensError as exc:
        checks.append(Check("device", "fail", str(exc)))
        dev = None
    if dev is not None:
        checks.append(_device_check(dev))
        checks.extend(_dtype_checks(dev))
        checks.append(_curvature_check(dev))
    failed = list(dict.fromkeys(c.name for c in checks if c.status == "fail"))
    warned = list(dict.fromkeys(c.name for c in checks if c.status == "warn"))
    if failed:
        verdict = f"NOT READY: {', '.join(failed)} failed (see above)"
    elif warned:
        verdict = f"ready on {dev}, with warnings: {', '.join(warned)}"
    else:
        verdict = f"ready on {dev}"
    return checks, verdict


def as_dict(checks: list[Check], verdict: str) -> dict:
    return {"checks": [asdict(c) for c in checks], "verdict": verdict}
