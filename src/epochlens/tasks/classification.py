"""Classification: cross-entropy over the logits of the active classes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from epochlens.errors import ConfigError
from epochlens.tasks.base import Task
from epochlens.tasks.draws import Uniforms


class ClassificationTask(Task):
    """Cross-entropy over the logits of the active classes (all classes if ``active_classes`` is None).

    Targets are class ids (B,); a sample whose class is not active is not scorable. The prediction is
    the logits restricted to the active classes, in ``active_classes`` order, (B, A).
    """

    name = "classification"

    def __init__(
        self, active_classes: np.ndarray | list[int] | None = None, output: str | int | None = "logits"
    ):
        super().__init__(output)
        if active_classes is None:
            self.active = None
        else:
            active = np.asarray(active_classes, dtype=np.int64)
            if (
                active.ndim != 1
                or len(active) == 0
                or len(np.unique(active)) != len(active)
                or active.min() < 0
            ):
                raise ConfigError(
                    f"active_classes must be distinct non-negative class ids, at least one; got {active}"
                )
            self.active = active
        self._lookup: dict[torch.device, torch.Tensor] = {}

    def prediction(self, outputs: Any) -> torch.Tensor:
        z = self.output(outputs)
        if z.ndim != 2:
            raise ConfigError(
                f"classification: the prediction has shape {tuple(z.shape)}, expected logits (batch, "
                "classes); pick the logits with the task's output field, or use the language_model task."
            )
        if self.active is None:
            return z
        if self.active.max() >= z.shape[1]:
            raise ConfigError(
                f"classification: active class {int(self.active.max())} but the model has {z.shape[1]} "
                "outputs; the class schedule does not fit the model."
            )
        return z.index_select(1, torch.as_tensor(self.active, device=z.device))

    def positions(self, targets: torch.Tensor, n_classes: int | None = None) -> torch.Tensor:
        """Position of each class id among the active classes (-1: not active), (B,) int64."""
        t = torch.as_tensor(targets).long()
        if self.active is None:
            bad = (t < 0) | (t >= n_classes) if n_classes is not None else t < 0
            return torch.where(bad, torch.full_like(t, -1), t)
        dev = t.device
        if dev not in self._lookup:
            size = int(self.active.max()) + 1
            lookup = torch.full((size,), -1, dtype=torch.long)
            lookup[torch.as_tensor(self.active)] = torch.arange(len(self.active))
            self._lookup[dev] = lookup.to(dev)
        lookup = self._lookup[dev]
        inside = (t >= 0) & (t < len(lookup))
        return torch.where(inside, lookup[t.clamp(0, len(lookup) - 1)], torch.full_like(t, -1))

    def scorable(self, inputs: Any, targets: Any) -> torch.Tensor | None:
        if targets is None:
            return None
        t = torch.as_tensor(targets)
        if t.ndim != 1 or t.is_floating_point():
            raise ConfigError(
                f"classification: targets must be class ids, a 1-D integer array; got {t.dtype} of shape "
                f"{tuple(t.shape)}. For continuous targets use the regression task."
            )
        return self.positions(t) >= 0

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        if targets is None:
            raise ConfigError("classification: the batch has no labels; its items must be (inputs, label)")
        pos = self.positions(torch.as_tensor(targets, device=prediction.device), prediction.shape[1])
        logp = torch.log_softmax(prediction, dim=1)
        picked = logp.gather(1, pos.clamp_min(0)[:, None])[:, 0]
        return torch.where(pos >= 0, -picked, torch.full_like(picked, math.nan))

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        p = torch.nan_to_num(torch.softmax(prediction.detach().to(torch.float64), dim=1), nan=0.0)
        u = uniforms(1)[:, 0].to(p.device)
        cdf = p.cumsum(1)
        pos = (cdf < u[:, None] * cdf[:, -1:]).sum(1).clamp_max(p.shape[1] - 1)
        if self.active is None:
            return pos
        return torch.as_tensor(self.active, device=pos.device)[pos]

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        p = torch.nan_to_num(torch.softmax(prediction.detach().to(torch.float64), dim=1), nan=0.0)
        eye = torch.eye(p.shape[1], dtype=p.dtype, device=p.device)
        return [p.clamp_min(0).sqrt()[:, c : c + 1] * (p - eye[c]) for c in range(p.shape[1])]

    def key(self) -> dict:
        active = None if self.active is None else [int(c) for c in self.active]
        return {"name": self.name, "output": self.output.key(), "active_classes": active}
