"""A model's logits out of whatever its forward returns, for the user's models and the pipeline's own.

* :func:`extract_logits` takes the logits out of a forward's output (a tensor, a dict, a Hugging
  Face ``ModelOutput``, a dataclass or a tuple);
* :func:`attach_output_adapter` installs it as a forward hook on the model itself, so ``model(x)``
  returns the logits tensor while module names and state_dict keys stay the user's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from epochlens.errors import EpochlensError


class OutputError(EpochlensError):
    """A model output from which no logits tensor can be taken."""


def extract_logits(output: Any, field: str | None = None) -> torch.Tensor:
    """The logits tensor in a forward's ``output``.

    Args:
        output: a tensor; a mapping (dict, Hugging Face ``ModelOutput``); an object with attributes
            (dataclass, named tuple); or a tuple/list.
        field: key or attribute holding the logits (``model.output``). None: a tensor as is, else
            ``["logits"]`` / ``.logits``, else the first element of a tuple or list.

    Returns:
        The logits, e.g. (N, num_classes) for a classifier.

    Raises:
        OutputError: no tensor at the named place, listing what the output holds.
    """
    if field is not None:
        if isinstance(output, Mapping) and field in output:
            value = output[field]
        elif not isinstance(output, Mapping) and hasattr(output, field):
            value = getattr(output, field)
        else:
            raise OutputError(
                f"the model's output ({type(output).__name__}) has no {field!r}; it holds "
                f"{_describe(output)}. Set model.output in the config to one of these."
            )
        if not isinstance(value, torch.Tensor):
            raise OutputError(
                f"model.output={field!r} is a {type(value).__name__}, not a tensor; name the logits."
            )
        return value
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if not isinstance(output, Mapping) and isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise OutputError(
        f"cannot find the logits in the model's output ({type(output).__name__} holding "
        f"{_describe(output)}); set model.output in the config to the key or attribute that holds them."
    )


def _describe(output: Any) -> str:
    if isinstance(output, Mapping):
        items = list(output.items())
    elif dataclasses.is_dataclass(output):
        items = [(f.name, getattr(output, f.name)) for f in dataclasses.fields(output)]
    elif isinstance(output, tuple) and hasattr(output, "_fields"):
        items = list(zip(output._fields, output, strict=True))
    elif isinstance(output, (tuple, list)):
        items = [(f"[{i}]", v) for i, v in enumerate(output)]
    elif hasattr(output, "__dict__"):
        items = [(k, v) for k, v in vars(output).items() if not k.startswith("_")]
    else:
        items = []
    return "{" + ", ".join(f"{k}: {type(v).__name__}" for k, v in items[:20]) + "}"


def attach_output_adapter(model: nn.Module, field: str | None = None) -> RemovableHandle:
    """Make ``model(x)`` return the logits tensor: a forward hook on the model that replaces its
    output with :func:`extract_logits` of it (a tensor output passes through unchanged).

    Module names and state_dict keys stay the user's (no wrapper module), so layer names in the
    config and checkpoint keys need no prefix. ``handle.remove()`` undoes it.
    """

    def hook(module: nn.Module, inputs: tuple, output: Any) -> torch.Tensor:
        return extract_logits(output, field)

    return model.register_forward_hook(hook)
