"""Device selection: ``auto`` picks CUDA, then MPS, then the CPU."""

from __future__ import annotations

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """Turn a config value (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ``mps``) into a device."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available; use device: auto")
    return device
