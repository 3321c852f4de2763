"""Regression: the squared error per sample (:func:`epochlens.outcome.squared_error`), and a
regression model's predictions and losses over a split (:func:`predict_regression`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from epochlens.errors import ConfigError
from epochlens.outcome import squared_error
from epochlens.tasks.base import Task
from epochlens.tasks.calls import call_model
from epochlens.tasks.draws import Uniforms

if TYPE_CHECKING:
    from torch import nn


class RegressionTask(Task):
    """Squared error between the prediction (B, ...) and targets of the same number of values.

    Args:
        reduction: ``mean`` (default): ℓ = ‖z − y‖²/D over a sample's D outputs, as ``nn.MSELoss``;
            ``sum``: ℓ = ‖z − y‖². Output Hessian H = (2/D)·I or 2·I; the true Fisher draws
            ŷ = z + σε with σ² = D/2 or 1/2 (the Gaussian whose NLL ℓ is).
        output: the prediction's field in the model output.
    """

    name = "regression"

    def __init__(self, reduction: str = "mean", output: str | int | None = "logits") -> None:
        super().__init__(output)
        if reduction not in ("mean", "sum"):
            raise ConfigError(f"regression: reduction={reduction!r} must be 'mean' or 'sum'")
        self.reduction = reduction

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        if targets is None:
            raise ConfigError("regression: the batch has no targets; its items must be (inputs, target)")
        try:
            return squared_error(prediction, torch.as_tensor(targets), self.reduction)
        except ValueError as exc:
            raise ConfigError(f"regression: {exc}") from None

    def _variance(self, d: int) -> float:
        return d / 2.0 if self.reduction == "mean" else 0.5

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        z = prediction.detach().to(torch.float64).reshape(prediction.shape[0], -1)
        eps = uniforms.normal(z.shape[1]).to(z.device)
        return (z + math.sqrt(self._variance(z.shape[1])) * eps).reshape(prediction.shape)

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        b, d = prediction.shape[0], int(np.prod(prediction.shape[1:])) if prediction.ndim > 1 else 1
        c = math.sqrt(2.0 / d) if self.reduction == "mean" else math.sqrt(2.0)
        eye = torch.eye(d, dtype=torch.float64, device=prediction.device) * c
        return [eye[j].expand(b, d).reshape(prediction.shape).clone() for j in range(d)]

    def key(self) -> dict:
        return {"name": self.name, "output": self.output.key(), "reduction": self.reduction}


def predict_regression(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: np.ndarray,
    reduction: str = "mean",
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """Predictions (N, D) float64 (D values per sample, as the targets) and each sample's loss
    (N,) float64 (:func:`epochlens.outcome.squared_error` with ``reduction``), eval mode, computed
    in the model's dtype. ``inputs`` (N, ...): a tensor, or rows sliced a batch at a time into
    tensors (``epochlens.data.rows.NormalizedRows``)."""
    model.eval().to(device)
    y = torch.as_tensor(np.asarray(targets))
    preds, losses = [], []
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            rows = slice(start, start + batch_size)
            z = call_model(model, inputs[rows].to(device))
            losses.append(squared_error(z, y[rows], reduction).double().cpu())
            preds.append(z.reshape(len(z), -1).double().cpu())
    width = 1 if y.ndim == 1 else y.shape[1]
    if not preds:
        return np.zeros((0, width)), np.zeros(0)
    return torch.cat(preds).numpy(), torch.cat(losses).numpy()
