"""Ablations of a transformer's attention heads and MLP neuron groups (text runs).

Every attention layer of the transformers our users run ends with an output projection whose
*input* is the concatenation of its heads' outputs, (batch, tokens, heads x head_dim): BERT's
``attention.output.dense``, GPT-2's ``attn.c_proj`` (a ``Conv1D``), Llama/Mistral/Qwen's
``self_attn.o_proj``, DistilBERT's ``attention.out_lin``, T5's ``SelfAttention.o``. Head h is the
slice ``h * head_dim : (h + 1) * head_dim`` of that input; a forward pre-hook on the projection
replaces it before it is mixed:

* ``zero``: by 0, exactly what zeroing the projection's weight columns of the head does;
* ``mean``: by the head's mean output over the reference samples' real tokens (per feature,
  accumulated in float64), so a head whose output is constant over the data changes nothing.

MLP neuron groups work the same way on the input of the MLP's down projection (BERT's
``output.dense``, GPT-2's ``mlp.c_proj``, Llama's ``mlp.down_proj``, T5's ``DenseReluDense.wo``):
``groups`` contiguous ranges of its intermediate neurons.

:func:`head_sites` and :func:`mlp_sites` find them by module name; :func:`ablated_units` applies
one ablation inside a ``with`` block. Padding tokens are never part of a mean.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from epochlens.ablation.settings import MODES
from epochlens.errors import ConfigError, LayerError

#: Name endings of the attention output projections (input: the heads' outputs side by side).
HEAD_PROJECTIONS = (
    "attention.output.dense",
    "attn.c_proj",
    "self_attn.o_proj",
    "attention.out_lin",
    "SelfAttention.o",
)
#: Name endings of the MLP down projections (input: the intermediate neurons).
MLP_PROJECTIONS = ("output.dense", "mlp.c_proj", "mlp.down_proj", "DenseReluDense.wo", "ffn.lin2")


@dataclass(frozen=True)
class UnitSlice:
    """Features ``start`` .. ``stop - 1`` of the input of module ``site`` (layer ``layer``)."""

    site: str
    layer: int
    name: str  # "head 3" or "neurons 0-127"
    start: int
    stop: int


def _in_features(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return module.in_features
    weight = getattr(module, "weight", None)  # transformers' Conv1D: weight (in, out)
    if weight is not None and type(module).__name__ == "Conv1D":
        return int(weight.shape[0])
    raise LayerError(f"{type(module).__name__} is not a Linear or Conv1D projection")


def _sites(
    model: nn.Module, endings: tuple[str, ...], exclude: tuple[str, ...] = ()
) -> list[tuple[str, nn.Module]]:
    return [
        (name, module)
        for name, module in model.named_modules()
        if name.endswith(endings) and not name.endswith(exclude)
    ]


def head_sites(model: nn.Module, num_heads: int | None = None) -> list[UnitSlice]:
    """Every head of every attention layer, in layer order: (site, layer, "head h", slice).

    ``num_heads``: heads per layer (default: ``model.config``'s ``num_attention_heads``, ``n_head``
    or ``num_heads``)."""
    config = getattr(model, "config", None)
    heads = num_heads or next(
        (
            getattr(config, k)
            for k in ("num_attention_heads", "n_head", "num_heads")
            if getattr(config, k, None)
        ),
        None,
    )
    if not heads:
        raise ConfigError("head ablation needs the number of heads per layer (the model's config has none)")
    sites = _sites(model, HEAD_PROJECTIONS)
    if not sites:
        raise LayerError(
            f"{type(model).__name__}: no attention output projection found (modules ending in "
            f"{', '.join(HEAD_PROJECTIONS)})."
        )
    out = []
    for layer, (name, module) in enumerate(sites):
        width = _in_features(module)
        if width % heads:
            raise LayerError(f"{name}: {width} input features do not split into {heads} heads")
        d = width // heads
        out += [UnitSlice(name, layer, f"head {h}", h * d, (h + 1) * d) for h in range(heads)]
    return out


def mlp_sites(model: nn.Module, groups: int) -> list[UnitSlice]:
    """``groups`` contiguous neuron ranges of every MLP's intermediate layer, in layer order."""
    if groups < 1:
        raise ConfigError(f"MLP neuron groups: {groups} must be >= 1")
    sites = _sites(model, MLP_PROJECTIONS, exclude=HEAD_PROJECTIONS)
    if not sites:
        raise LayerError(
            f"{type(model).__name__}: no MLP down projection found (modules ending in "
            f"{', '.join(MLP_PROJECTIONS)})."
        )
    out = []
    for layer, (name, module) in enumerate(sites):
        edges = np.cumsum(
            [0, *(len(part) for part in np.array_split(np.arange(_in_features(module)), groups))]
        )
        out += [
            UnitSlice(name, layer, f"neurons {lo}-{hi - 1}", int(lo), int(hi))
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
            if hi > lo
        ]
    return out


@torch.no_grad()
def site_means(
    model: nn.Module, batches: Iterator[Mapping[str, torch.Tensor]], sites: list[str]
) -> dict[str, torch.Tensor]:
    """Mean input (features,) of each site over the real tokens of ``batches`` (a text model's
    keyword inputs with ``attention_mask``), accumulated in float64."""
    modules = dict(model.named_modules())
    sums: dict[str, torch.Tensor] = {}
    count = torch.zeros((), dtype=torch.float64)
    mask: list[torch.Tensor] = []

    def make(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:
            x = inputs[0].detach().double()
            real = mask[0].to(x.device).bool()
            s = x[real].sum(0)  # (features,): real tokens only
            sums[name] = s if name not in sums else sums[name] + s

        return hook

    handles = [modules[s].register_forward_pre_hook(make(s)) for s in sites]
    try:
        for batch in batches:
            mask[:] = [batch["attention_mask"]]
            count += batch["attention_mask"].sum()
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return {s: (sums[s] / count).float() for s in sites}


@contextmanager
def ablated_units(
    model: nn.Module, unit: UnitSlice, mode: str, means: Mapping[str, torch.Tensor] | None = None
) -> Iterator[None]:
    """Inside the block, ``model``'s forward replaces ``unit``'s slice of its site's input."""
    if mode not in MODES:
        raise ConfigError(f"ablation mode {mode!r} must be one of {list(MODES)}")
    if mode == "mean" and (means is None or unit.site not in means):
        raise ValueError(f"mean ablation of {unit.site!r} needs its means (see site_means)")
    sl = slice(unit.start, unit.stop)

    def hook(module: nn.Module, inputs: tuple) -> tuple:
        x = inputs[0].clone()
        x[..., sl] = 0 if mode == "zero" else means[unit.site][sl].to(x.device, x.dtype)
        return (x, *inputs[1:])

    handle = dict(model.named_modules())[unit.site].register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()
