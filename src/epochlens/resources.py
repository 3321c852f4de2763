"""Which device a job uses, from the config's ``device`` and the resources the job is given
(torch-free: the workflow and ``epochlens doctor`` plan with it, jobs resolve it).

The config's ``device`` applies to the jobs that are given a GPU: the rules that compute on one
declare ``gpu`` in the workflow (:func:`gpu_request`), and a profile may change any rule's
``gpu``/``gpu_model``/``gres`` (``set-resources``). Every other job computes on the CPU, whatever
``device`` says: on a cluster such a job runs on a node, or a share of one, without a GPU.

==================  =================  ========================================
config ``device``   job given a GPU    job without one
==================  =================  ========================================
auto                CUDA, MPS or CPU   cpu
cuda, cuda:N, mps   that device        cpu
cpu                 cpu                cpu
==================  =================  ========================================

A job numbers the GPUs it is given from ``cuda:0`` (SLURM sets CUDA_VISIBLE_DEVICES), so
``cuda:N`` needs N+1 of them (checked in the job: :func:`epochlens.device.job_device`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Compute precisions of the forward-only stages (ablations): float32, or autocast to a 16-bit float
#: where the device supports it (:func:`epochlens.device.autocast`). Curvature and influence always
#: compute in float32 and float64.
PRECISIONS = ("float32", "bfloat16", "float16")

#: The resources that give a job GPUs (as snakemake-executor-plugin-slurm reads them).
GPU_RESOURCES = ("gpu", "gpu_model", "gres")


def _count(value: Any) -> int:
    """A resource value as a GPU count (``"2"`` -> 2; unset, empty or not a number -> 0)."""
    if value is None or isinstance(value, bool):
        return int(bool(value))
    try:
        return max(0, int(str(value).strip().strip("'\"") or 0))
    except ValueError:
        return 0


def gres_gpus(gres: Any) -> int:
    """GPUs in a SLURM ``gres`` request: ``gpu`` -> 1, ``gpu:2`` -> 2, ``gpu:a100:2`` -> 2; other
    generic resources (``shard:1``, ...) -> 0. Several requests may be comma-separated."""
    total = 0
    for item in str(gres or "").strip().strip("'\"").split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        last = parts[-1] if len(parts) > 1 else "1"
        m = re.fullmatch(r"(\d+)", last)
        total += int(m.group(1)) if m else 1
    return total


def gpus_requested(resources: Mapping[str, Any]) -> int:
    """GPUs a job asks for: ``gpu`` (a count), ``gpu_model`` alone (one GPU of that model), or a
    ``gres`` naming GPUs; 0 when none of them is set."""
    gpus = _count(resources.get("gpu"))
    if not gpus and resources.get("gpu_model"):
        gpus = 1
    return max(gpus, gres_gpus(resources.get("gres")))


def job_device(device: str, resources: Mapping[str, Any]) -> str:
    """The device name a job computes on: ``device`` (the config's) when ``resources`` give the
    job a GPU, ``"cpu"`` otherwise (see the table above)."""
    return device if gpus_requested(resources) > 0 else "cpu"


def gpu_request(device: str) -> int:
    """The ``gpu`` resource the workflow declares for a rule that computes on a GPU when there is
    one: 1, or 0 when the config says ``device: cpu`` (no GPU is asked for, e.g. on a cluster
    without GPUs)."""
    return 0 if device == "cpu" else 1
