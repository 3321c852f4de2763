"""A model used where it is for a job's forward passes, never copied (a copy holds the weights
twice: 29 GB more for a 7B model in float32)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def evaluated(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """``model`` itself on ``device``, in eval mode, without gradients; its device, training flags
    and ``requires_grad`` put back as they were on exit (moved only where it is elsewhere)."""
    training = [(m, m.training) for m in model.modules()]
    requires = [(p, p.requires_grad) for p in model.parameters()]
    origin = next((p.device for p in model.parameters()), torch.device(device))
    try:
        yield model.to(device).eval().requires_grad_(False)
    finally:
        model.to(origin)
        for m, flag in training:
            m.training = flag
        for p, flag in requires:
            p.requires_grad_(flag)
