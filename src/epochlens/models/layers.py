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

from collections.abc import Sequence

import torch
from torch import nn

from epochlens.errors import EpochlensError, LayerError


def default_layers(model: nn.Module) -> list[str]:
    """Every block output of ``model``, in forward order.

    * ``SmallCNN``: ``block1``, ``block2``, ``block3`` (each conv-BN-ReLU).
    * ``ResNet18LoP``: the eight basic blocks ``layer1.0``, ``layer1.1``, ..., ``layer4.1``.
    * Any other model: its direct children that hold parameters, except a final ``nn.Linear``
      (the classifier head).
    """
    name = type(model).__name__
    modules = dict(model.named_modules())
    if name == "SmallCNN":
        return ["block1", "block2", "block3"]
    if name == "ResNet18LoP":
        return [f"layer{i}.{j}" for i in range(1, 5) for j in range(2) if f"layer{i}.{j}" in modules]
    children = [(n, m) for n, m in model.named_children() if any(True for _ in m.parameters())]
    if children and isinstance(children[-1][1], nn.Linear):
        children = children[:-1]
    if not children:
        raise LayerError(
            f"{name} has no child modules with parameters to use as default layers; name the "
            f"layers explicitly (available: {_short(available_layers(model), 40)})."
        )
    return [n for n, _ in children]


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


def check_finite_weights(model: nn.Module) -> None:
    """Raise EpochlensError naming every parameter or buffer that holds NaN or Inf."""
    bad = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and not bool(torch.isfinite(t.detach()).all()):
            bad.append(name)
    if bad:
        raise EpochlensError(
            f"model weights contain NaN or Inf in {_short(bad)}: the checkpoint is corrupt or "
            "training diverged. Re-copy the checkpoint, or exclude this epoch from the analysis."
        )


def _short(items: list, n: int = 10) -> str:
    return str(list(items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")
