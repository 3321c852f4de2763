"""How a model is called with a batch's inputs (:func:`call_model`), which tensor of its output
is the prediction (:class:`OutputAdapter`), and how a batch splits into inputs and targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from epochlens.errors import ConfigError


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a Mapping, ``model(*inputs)`` for a tuple/list, else ``model(inputs)``."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


class OutputAdapter:
    """Extracts the prediction tensor from a model's output.

    Args:
        field: for a dict or ``ModelOutput``, the key or attribute (default ``"logits"``); for a tuple
            or list, an int index (a non-integer field takes item 0); a tensor is returned as is.
    """

    def __init__(self, field: str | int | None = "logits") -> None:
        self.field = "logits" if field is None else field

    def __call__(self, outputs: Any) -> torch.Tensor:
        out = outputs
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, Mapping) or hasattr(out, "keys"):  # dict, ModelOutput (an OrderedDict)
            if isinstance(self.field, str) and self.field in out.keys():
                out = out[self.field]
            elif isinstance(self.field, int):
                out = list(out.values())[self.field]
            else:
                raise ConfigError(
                    f"the model returned a {type(outputs).__name__} with fields {list(out.keys())}, none "
                    f"named {self.field!r}; set the task's output field to the one holding the predictions."
                )
        elif isinstance(out, (tuple, list)):
            out = out[self.field if isinstance(self.field, int) else 0]
        elif isinstance(self.field, str) and hasattr(out, self.field):
            out = getattr(out, self.field)
        if not isinstance(out, torch.Tensor):
            raise ConfigError(
                f"the model's output {type(outputs).__name__} gives a {type(out).__name__} at field "
                f"{self.field!r}, not a tensor; set the task's output field to the predictions' field."
            )
        return out

    def key(self) -> str | int:
        return self.field


def _batch_inputs_targets(batch: Any, labels_key: str = "labels") -> tuple[Any, Any]:
    if isinstance(batch, Mapping):
        inputs = {k: v for k, v in batch.items() if k != labels_key}
        return inputs, batch.get(labels_key)
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1:
            return batch[0], None
        raise ConfigError(
            f"a batch is a {type(batch).__name__} of {len(batch)} items; the default task reads (inputs,) "
            "or (inputs, targets). Return those from the dataset, or override Task.split_batch."
        )
    return batch, None
