"""Device selection: ``auto`` picks CUDA, then MPS, then the CPU; float64 where the device has it."""

from __future__ import annotations

import torch
from torch import nn

from epochlens.errors import ConfigError


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_device(name: str = "auto") -> torch.device:
    """Turn a config value (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ``mps``) into a device.

    Raises:
        ConfigError: a device that does not exist or is not available on this machine.
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
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {name!r} requested but CUDA is not available; use device: auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device: {name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    if device.type == "mps" and not mps_available():
        raise ConfigError(f"device: {name!r} requested but MPS is not available; use device: auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device: {name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


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
