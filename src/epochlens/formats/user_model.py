"""The user's model: building it from its factory, its logits, and its default blocks.

* :func:`build_user_model` calls the factory of a :class:`~epochlens.formats.factory.FactorySpec`
  and checks that it returns an ``nn.Module``.
* :func:`extract_logits` takes the logits out of whatever the forward returns (a tensor, a dict,
  a Hugging Face ``ModelOutput``, a dataclass or a tuple); :func:`attach_output_adapter` installs
  it as a forward hook on the model itself, so ``model(x)`` returns the logits tensor while module
  names and state_dict keys stay the user's.
* :func:`default_blocks` names the residual blocks / encoder layers that features, ablation and
  influence use when the config names none.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from epochlens.errors import EpochlensError
from epochlens.formats.factory import FactoryError, FactorySpec, import_factory
from epochlens.models.layers import BlockError, default_blocks

__all__ = [
    "BlockError",
    "OutputError",
    "attach_output_adapter",
    "build_user_model",
    "default_blocks",
    "extract_logits",
]


class OutputError(EpochlensError):
    """A model output from which no logits tensor can be taken."""


def build_user_model(spec: FactorySpec, defaults: Mapping[str, Any] | None = None) -> nn.Module:
    """Call the factory with ``spec.kwargs`` and return the ``nn.Module`` it builds.

    Args:
        spec: the factory and its keyword arguments.
        defaults: values the pipeline knows (e.g. ``num_classes``, ``in_channels``), passed only for
            parameters the factory accepts (by name or through ``**kwargs``) and ``model.kwargs`` does
            not set.

    Raises:
        FactoryError: import failures (see :func:`import_factory`), kwargs that do not fit the
            factory's signature, an exception inside the factory, or a result that is no ``nn.Module``.
    """
    fn = import_factory(spec)
    kwargs = dict(spec.kwargs)
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C extensions have none
        signature = None
    if signature is not None:
        params = signature.parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for name, value in (defaults or {}).items():
            if name not in kwargs and (name in params or var_kw):
                kwargs[name] = value
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise FactoryError(
                f"model.kwargs {spec.kwargs} do not fit {spec.factory}{signature} ({exc}); fix "
                "model.kwargs in the config."
            ) from exc
    try:
        model = fn(**kwargs)
    except Exception as exc:
        raise FactoryError(
            f"model.factory={spec.factory!r} raised {type(exc).__name__}: {str(exc)[:300]} when called "
            f"with {kwargs}; fix model.kwargs or the factory."
        ) from exc
    if not isinstance(model, nn.Module):
        hint = ""
        if isinstance(model, (tuple, list)) and any(isinstance(m, nn.Module) for m in model):
            hint = " (it returned a sequence holding a module: return the module itself)"
        raise FactoryError(
            f"model.factory={spec.factory!r} returned a {type(model).__name__}, not a torch.nn.Module"
            f"{hint}. Point model.factory at a function that returns the network."
        )
    return model


# ---------------------------------------------------------------------------------------------
# Logits out of any output


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
