"""The task interface (:class:`Task`): a run's loss per sample, its measurement and its
output-space curvature (see :mod:`epochlens.tasks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from epochlens.errors import ConfigError
from epochlens.tasks.calls import OutputAdapter, _batch_inputs_targets, call_model
from epochlens.tasks.draws import Uniforms


class Task:
    """A run's loss (see the module doc). Subclass it and override :meth:`loss` at least.

    Attributes:
        name: shown in messages and stored in cache keys.
        output: the :class:`OutputAdapter` that picks the prediction from the model's output.
    """

    name = "task"

    def __init__(self, output: str | int | None = "logits") -> None:
        self.output = OutputAdapter(output)

    # -- batches and the model
    def split_batch(self, batch: Any) -> tuple[Any, Any]:
        """(model inputs, targets) of a batch: a dict without its ``labels`` and the labels, the two
        items of an (inputs, targets) tuple, or the batch itself and None."""
        return _batch_inputs_targets(batch)

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        """The model's output on ``inputs`` (see :func:`call_model`)."""
        return call_model(model, inputs)

    def prediction(self, outputs: Any) -> torch.Tensor:
        """The prediction tensor z (B, ...) the loss is a function of."""
        return self.output(outputs)

    # -- the loss and its curvature
    def scorable(self, inputs: Any, targets: Any) -> torch.Tensor | None:
        """(B,) bool: samples the task can compute a loss for (None: all). Others are not computed
        and get NaN results; they are not reported as errors (e.g. labels of inactive classes)."""
        return None

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        """Per-sample loss (B,), differentiable in ``prediction`` (given in float64)."""
        raise NotImplementedError(f"task {self.name!r} must implement loss(prediction, targets, inputs)")

    def measurement(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        """What a query's influence measures, (B,); default: the loss at the query's targets."""
        return self.loss(prediction, targets, inputs)

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        """Targets drawn from the model's predictive distribution at ``prediction`` (true Fisher)."""
        raise ConfigError(
            f"task {self.name!r} defines no predictive distribution to draw targets from, which the "
            "'true' Fisher needs; use influence fisher 'empirical' or 'expected', or give the task a "
            "sample_targets method."
        )

    def fisher_weight(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor | None:
        """(B,) factor on the sampled gradient so that E[w² ∇ℓ(ŷ)∇ℓ(ŷ)ᵀ] = H (None: 1).

        1 when the loss is the predictive distribution's negative log-likelihood. A loss that is c
        times an NLL (a mean over T tokens: c = 1/T) has H = c·H_NLL but a sampled gradient of
        covariance c²·H_NLL: w = 1/√c.
        """
        return None

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        """Vectors v_k shaped like ``prediction`` with Σ_k v_k v_kᵀ = H_n per sample (expected Fisher).

        Generic: H_n from automatic differentiation of the loss (one Hessian-vector product per
        output coordinate D, all samples at once), eigendecomposed per sample; v_k = √λ_k u_k, negative
        eigenvalues (a loss that is not convex in z) clamped to 0. D vectors.
        """
        z = prediction.detach().to(torch.float64)
        b, shape = z.shape[0], z.shape[1:]
        d = int(np.prod(shape)) if len(shape) else 1
        if d > 4096:
            raise ConfigError(
                f"task {self.name!r}: the expected Fisher needs {d} backward passes (one per output "
                "coordinate); use influence fisher 'true' or 'empirical'."
            )
        zz = z.clone().requires_grad_(True)
        with torch.enable_grad():
            grad = torch.autograd.grad(self.loss(zz, targets, inputs).sum(), zz, create_graph=True)[0]
            flat = grad.reshape(b, d)
            cols = []
            for j in range(d):
                (h,) = torch.autograd.grad(flat[:, j].sum(), zz, retain_graph=j < d - 1, allow_unused=True)
                cols.append(torch.zeros(b, d, dtype=z.dtype) if h is None else h.reshape(b, d))
        hess = torch.stack(cols, dim=2)  # (B, D, D): column j = ∂grad/∂z_j
        hess = (hess + hess.transpose(1, 2)) / 2
        values, vectors = torch.linalg.eigh(hess)
        roots = values.clamp_min(0.0).sqrt()
        return [(vectors[:, :, k] * roots[:, k : k + 1]).reshape(b, *shape) for k in range(d)]

    def position_mask(self, inputs: Any) -> torch.Tensor | None:
        """(B, T) bool: positions that are real tokens (None: all). Default: an ``attention_mask``.

        A model with several token dimensions (an encoder-decoder's) gives a tuple of masks of
        different lengths; a layer takes the one whose length is its input's."""
        if isinstance(inputs, Mapping) and inputs.get("attention_mask") is not None:
            return inputs["attention_mask"].bool()
        return None

    def key(self) -> dict:
        """What the task is, for cache keys and metadata (JSON-able)."""
        return {"name": self.name, "output": self.output.key()}


def _check_loss_shape(value: torch.Tensor, n: int, task: Task) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.shape != (n,):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(
            f"task {task.name!r} returned a loss of shape {shape} for a batch of {n} samples; it must "
            f"return one loss per sample, shape ({n},) (no mean over the batch)."
        )
    return value


def per_sample_loss(
    task: Task, prediction: torch.Tensor, targets: Any, inputs: Any, measurement: bool = False
) -> torch.Tensor:
    """The task's loss (or measurement) per sample, checked to be (B,)."""
    fn = task.measurement if measurement else task.loss
    return _check_loss_shape(fn(prediction, targets, inputs), prediction.shape[0], task)
