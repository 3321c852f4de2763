"""Device selection: ``auto`` picks CUDA, then MPS, then the CPU; float64 where the device has it.
A workflow job computes on the config's device only when it is given a GPU (:func:`job_device`,
:mod:`epochlens.resources`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from epochlens import resources as job_resources
from epochlens.errors import ConfigError


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_device(name: str = "auto", gpus: int | None = None) -> torch.device:
    """Turn a config value (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ``mps``) into a device.

    Args:
        name: the device.
        gpus: in a workflow job, the GPUs its resources give it (named in the errors).

    Raises:
        ConfigError: a device that does not exist or is not available here; for CUDA, what this
            process sees (CUDA_VISIBLE_DEVICES, the CUDA build of torch) and what to change.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        given = f"; the job was given {gpus} GPU(s)" if gpus is not None else ""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "CUDA_VISIBLE_DEVICES unset"
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device: {name!r}, but this process sees no CUDA device ({seen}; torch "
                f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}){given}. Use "
                "device: auto to fall back to the CPU, or run on a GPU node with a CUDA build of "
                "torch (epochlens doctor checks both)."
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"device: {name!r}, but this process sees {count} CUDA device(s), cuda:0 to "
                f"cuda:{count - 1} ({seen}){given}. A job numbers the GPUs it is given from "
                f"cuda:0: use device: cuda, or give the rule {device.index + 1} GPUs "
                f"(set-resources: <rule>: {{gpu: {device.index + 1}}} in your profile)."
            )
    if device.type == "mps" and not mps_available():
        raise ConfigError(f"device: {name!r} requested but MPS is not available; use device: auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device: {name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def job_device(device: str, resources: Mapping[str, Any] | None) -> torch.device:
    """The device of a workflow job: the config's ``device`` when the job's ``resources`` give it a
    GPU, else the CPU (:func:`epochlens.resources.job_device`); ``resources`` None (a library
    caller, not a job): ``device`` itself.

    Raises:
        ConfigError: the device is not available to the job (e.g. ``cuda:1`` in a job given one GPU).
    """
    if resources is None:
        return resolve_device(device)
    name = job_resources.job_device(device, resources)
    return resolve_device(name, job_resources.gpus_requested(resources))


def model_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """``device`` resolved ("auto", "cuda", ...); None: the device of the model's weights."""
    if device is None:
        tensors = [*model.parameters(), *model.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")
    return resolve_device(device) if isinstance(device, str) else torch.device(device)


def supports_float64(device: torch.device) -> bool:
    """MPS has no float64; CPUs and CUDA devices do."""
    return torch.device(device).type != "mps"


def device_for_dtype(device: torch.device, dtype: torch.dtype) -> torch.device:
    """``device``, or the CPU when ``dtype`` is float64 and the device lacks it."""
    if dtype == torch.float64 and not supports_float64(device):
        return torch.device("cpu")
    return torch.device(device)


def autocast(device: torch.device | str, precision: str = "float32") -> AbstractContextManager:
    """A context that runs forward passes on ``device`` in ``precision``: nothing for float32, else
    ``torch.autocast`` to that 16-bit dtype (matrix products and convolutions in it; losses and
    reductions stay float32).

    Raises:
        ConfigError: an unknown precision, or autocast unavailable on the device.
    """
    if precision not in job_resources.PRECISIONS:
        raise ConfigError(f"precision {precision!r} must be one of {list(job_resources.PRECISIONS)}")
    if precision == "float32":
        return nullcontext()
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):
        raise ConfigError(f"precision {precision}: no autocast on {kind}; use float32 there")
    return torch.autocast(kind, dtype=getattr(torch, precision))
