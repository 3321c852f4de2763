"""Which modules of a model the stages look at, and a sanity check of its weights.

Shared by every stage that hooks or runs a checkpoint (features, ablation, influence, curvature),
so that none of them imports another stage's code:

* a *layer spec* is ``None`` (every block output of the architecture, :func:`default_layers`) or a
  list of module names as in ``model.named_modules()`` (``"block2"``, ``"layer3.1"``, ``"fc"``);
* :func:`check_finite_weights` refuses a checkpoint whose weights hold NaN or Inf.

The names of the built-in models are also known without torch (:mod:`epochlens.models.catalog`),
so that the configuration is checked while the workflow is planned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn

from epochlens.checkpoints import nonfinite
from epochlens.errors import EpochlensError, LayerError


class BlockError(LayerError):
    """A model in which no default blocks can be found."""


def default_layers(model: nn.Module) -> list[str]:
    """Every block output of ``model``, in forward order.

    * ``SmallCNN``: ``block1``, ``block2``, ``block3`` (each conv-BN-ReLU).
    * ``ResNet18LoP``: the eight basic blocks ``layer1.0``, ``layer1.1``, ..., ``layer4.1``.
    * Any other model: :func:`default_blocks` (every residual block / encoder layer).
    """
    name = type(model).__name__
    modules = dict(model.named_modules())
    if name == "SmallCNN":
        return ["block1", "block2", "block3"]
    if name == "ResNet18LoP":
        return [f"layer{i}.{j}" for i in range(1, 5) for j in range(2) if f"layer{i}.{j}" in modules]
    return default_blocks(model)


def available_layers(model: nn.Module) -> list[str]:
    """Every hookable module name of ``model`` (``named_modules`` without the root)."""
    return [n for n, _ in model.named_modules() if n]


def resolve_layers(model: nn.Module, layers: Sequence[str] | None, key: str = "features.layers") -> list[str]:
    """Module names of a layer spec; None gives :func:`default_layers`.

    Args:
        model: the network whose modules are named.
        layers: the spec (None, one name or a list of names).
        key: the config key the spec comes from, named in errors.

    Raises:
        LayerError: a name the model does not have (listing the available ones) or a repeated name.
    """
    if layers is None:
        return default_layers(model)
    layers = [layers] if isinstance(layers, str) else list(layers)
    names = available_layers(model)
    unknown = [n for n in layers if n not in set(names)]
    if unknown:
        raise LayerError(
            f"{type(model).__name__} has no layer(s) {unknown}. Available layers: {_short(names, 80)}. "
            f"Default (block outputs): {default_layers(model)}. Fix {key} in the config."
        )
    if len(set(layers)) != len(layers):
        raise LayerError(f"layer spec {layers} names a module twice; list each layer once.")
    return layers


def channels_first(act: torch.Tensor) -> torch.Tensor:
    """A layer's output with its channels (features) on dim 1, as every stage reads it.

    Convolutional outputs (B, C, H, W) already are. A 3-D output is read as (batch, tokens,
    features), the layout of transformers, ViTs and MLP-Mixers (``nn.Linear`` and ``LayerNorm``
    act on the last dim), and returned as a (B, D, T) view: the channels of pooled features,
    feature statistics and ablation groups are then the D features of every token (pooling
    averages over the tokens). A 1-D convolution's (B, C, L) output would be read the same
    way, as L channels: name the layers of such a model after a flatten or pooling instead.
    2-D outputs (B, D) are unchanged.
    """
    return act.transpose(1, 2) if act.ndim == 3 else act


def check_finite_weights(model: nn.Module) -> None:
    """Raise EpochlensError naming every parameter or buffer that holds NaN or Inf."""
    bad = nonfinite([*model.named_parameters(), *model.named_buffers()])
    if bad:
        raise EpochlensError(
            f"model weights contain NaN or Inf in {_short(bad)}: the checkpoint is corrupt or "
            "training diverged. Re-copy the checkpoint, or exclude this epoch from the analysis."
        )


def _short(items: list, n: int = 10) -> str:
    return str(list(items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")


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
       :func:`default_layers` did for unknown models before).

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
