"""What the batched softmax probes share, fitted per seed (:mod:`epochlens.probes.batched`) or on
shared mini-batches (:mod:`epochlens.probes.shared_order`): each seed's rows (:class:`SeedSplit`),
the fitted probes (:class:`BatchedFit`) and torch's Adam update on stacked weights (:func:`_adam`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as the one-at-a-time probe uses
EPS = 1e-8


@dataclass
class SeedSplit:
    """Global row positions of one seed's fit and early-stopping samples."""

    fit: torch.Tensor  # (n_fit,)
    stop: torch.Tensor  # (n_stop,), the fit samples when there are none held out


@dataclass
class BatchedFit:
    """P = G x S fitted probes (layer-major), logits = ((x - mean) / scale) @ weight + bias."""

    weight: torch.Tensor  # (P, D, K)
    bias: torch.Tensor  # (P, K)
    mean: torch.Tensor  # (P, D)
    scale: torch.Tensor  # (P, D)
    best_epoch: list[int]
    epochs_run: list[int]


def _adam(
    param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float
) -> None:
    """torch.optim.Adam's update (no weight decay, no amsgrad), in place."""
    b1, b2 = BETAS
    m.lerp_(grad, 1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2**step)).add_(EPS)
    param.addcdiv_(m, denom, value=-lr / (1 - b1**step))
