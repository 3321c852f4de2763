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
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from epochlens.errors import EpochlensError
from epochlens.formats.factory import FactoryError, FactorySpec, import_factory


class OutputError(EpochlensError):
    """A model output from which no logits tensor can be taken."""


class BlockError(EpochlensError):
    """A model in which no default blocks can be found."""


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


# ---------------------------------------------------------------------------------------------
# Default blocks


def default_blocks(model: nn.Module) -> list[str]:
    """Names (as in ``named_modules()``) of the model's repeated blocks, in registration order.

    The rule, in order:

    1. *Block groups*: modules with submodules and parameters that are children of an
       ``nn.ModuleList`` / ``nn.Sequential`` holding at least two of the same class (torchvision
       ResNet ``layer1.0`` ... ``layer4.1``; timm ViT ``blocks.N``; Hugging Face ``encoder.layer.N``,
       GPT-2 ``transformer.h.N``, Llama ``model.layers.N``; T5's encoder and decoder blocks). Groups
       nested inside other groups' blocks are dropped, except when the nested blocks hold at least
       half of the parameters of every outer block: then the outer ones are stages made of blocks
       (ConvNeXt/Swin ``stages.N.blocks.M``) and the nested blocks are taken instead. Every remaining
       group is returned, merged in module order.
    2. Otherwise the largest group of repeated parameterised leaf layers in one container (a flat
       ``nn.Sequential`` CNN: its convolutions).
    3. Otherwise the direct children that hold parameters, except a final ``nn.Linear`` head (as
       :func:`epochlens.features.default_layers` for unknown models).

    Raises:
        BlockError: none of these finds anything; name the layers in the config.
    """
    modules = dict(model.named_modules())
    order = {name: i for i, name in enumerate(modules)}
    composite: dict[type, list[str]] = {}
    leaf: list[tuple[int, int, list[str]]] = []
    for name, container in modules.items():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = [(_join(name, n), c) for n, c in container.named_children() if _n_params(c) > 0]
        counts = Counter(type(c) for _, c in children)
        for cls, count in counts.items():
            if count < 2:
                continue
            members = [n for n, c in children if type(c) is cls]
            if any(True for _ in modules[members[0]].children()):
                composite.setdefault(cls, []).extend(members)
            else:
                params = sum(_n_params(modules[n]) for n in members)
                leaf.append((count, params, members))
    if composite:
        chosen = _outermost_groups(list(composite.values()), modules)
        return sorted((n for group in chosen for n in group), key=order.__getitem__)
    if leaf:
        leaf.sort(key=lambda t: (-t[0], -t[1], order[t[2][0]]))
        return leaf[0][2]
    children = [(n, c) for n, c in model.named_children() if _n_params(c) > 0]
    if children and isinstance(children[-1][1], nn.Linear):
        children = children[:-1]
    if not children:
        available = [n for n in modules if n][:40]
        raise BlockError(
            f"{type(model).__name__}: no repeated blocks or parameterised children to use as default "
            f"layers; name them in the config (module names as in named_modules(), e.g. {available})."
        )
    return [n for n, _ in children]


def _outermost_groups(groups: list[list[str]], modules: dict[str, nn.Module]) -> list[list[str]]:
    """Groups not nested in another group's blocks; a group of stages whose nested blocks hold at
    least half of each stage's parameters is replaced by those nested groups."""

    def inside(name: str, group: list[str]) -> bool:
        return any(name.startswith(outer + ".") for outer in group)

    def nested_in(group: list[str]) -> list[list[str]]:
        return [g for g in groups if g is not group and all(inside(n, group) for n in g)]

    roots = [g for g in groups if not any(g is not h and inside(g[0], h) for h in groups)]
    result: list[list[str]] = []
    todo = list(roots)
    while todo:
        group = todo.pop(0)
        nested = nested_in(group)
        inner = [g for g in nested if not any(inside(g[0], h) for h in nested if h is not g)]
        if inner and all(
            sum(_n_params(modules[n]) for g in inner for n in g if n.startswith(outer + "."))
            >= 0.5 * _n_params(modules[outer])
            for outer in group
        ):
            todo.extend(inner)
        else:
            result.append(group)
    return result


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _n_params(module: nn.Module) -> int:
    """Number of parameters (an uninitialised lazy parameter counts as one)."""
    return sum(
        1 if isinstance(p, nn.parameter.UninitializedParameter) else p.numel() for p in module.parameters()
    )
