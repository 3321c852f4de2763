"""A user's per-sample loss function as a task (:class:`LossFunctionTask`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from epochlens.tasks.base import Task
from epochlens.tasks.draws import Uniforms


class LossFunctionTask(Task):
    """A task from a per-sample loss function ``fn(prediction, targets) -> (B,)``.

    Args:
        fn: the loss; must return one value per sample, each depending on that sample only.
        sample: optional ``sample(prediction, targets, uniforms) -> targets`` drawing from the model's
            predictive distribution (for the true Fisher); ``uniforms`` is a :class:`Uniforms`.
        measurement: optional ``measurement(prediction, targets) -> (B,)`` for queries.
        output: the prediction's field in the model output.
        name: for messages and cache keys.
        kwargs: keyword arguments of ``fn`` (e.g. ``{"reduction": "none"}``).
    """

    def __init__(
        self,
        fn: Callable,
        sample: Callable | None = None,
        measurement: Callable | None = None,
        output: str | int | None = "logits",
        name: str | None = None,
        kwargs: Mapping | None = None,
    ) -> None:
        super().__init__(output)
        self.fn, self.sampler, self.measure = fn, sample, measurement
        self.kwargs = dict(kwargs or {})
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        return self.fn(prediction, targets, **self.kwargs)

    def measurement(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        return (
            self.loss(prediction, targets, inputs)
            if self.measure is None
            else self.measure(prediction, targets)
        )

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        if self.sampler is None:
            return super().sample_targets(prediction, targets, inputs, uniforms)
        return self.sampler(prediction, targets, uniforms)

    def key(self) -> dict:
        return {"name": self.name, "output": self.output.key(), "kwargs": self.kwargs}
