"""Ablations of a transformer's attention heads and MLP neuron groups (text runs).

Every attention layer of the transformers our users run ends with an output projection whose
*input* is the concatenation of its heads' outputs, (batch, tokens, heads x head_dim): BERT's
``attention.output.dense``, GPT-2's ``attn.c_proj`` (a ``Conv1D``), Llama/Mistral/Qwen's
``self_attn.o_proj``, DistilBERT's ``attention.out_lin``, T5's ``SelfAttention.o`` (encoder and
decoder self-attention) and ``EncDecAttention.o`` (the decoder's cross-attention), BART's (and
mBART's, Pegasus', Marian's) ``self_attn.out_proj`` (encoder and decoder self-attention) and
``encoder_attn.out_proj`` (cross-attention). Head h is the
slice ``h * head_dim : (h + 1) * head_dim`` of that input; a forward pre-hook on the projection
replaces it before it is mixed:

* ``zero``: by 0, exactly what zeroing the projection's weight columns of the head does;
* ``mean``: by the head's mean output over the reference samples' real tokens (per feature,
  accumulated in float64), so a head whose output is constant over the data changes nothing.

MLP neuron groups work the same way on the input of the MLP's down projection (BERT's
``output.dense``, GPT-2's ``mlp.c_proj``, Llama's ``mlp.down_proj``, T5's ``DenseReluDense.wo``,
BART's ``fc2``):
``groups`` contiguous ranges of its intermediate neurons.

:func:`head_sites` and :func:`mlp_sites` find them by module name; :func:`ablated_units` applies
one ablation inside a ``with`` block. Padding tokens are never part of a mean (an encoder-decoder
model's decoder sites: its real decoder positions, where the labels are not -100). A causal LM's
or a text-to-text model's outcome is its loss on each sample's target tokens and exact match
(:mod:`epochlens.outcome`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens.ablation.ablate import cohort_rows, per_sample_outcome
from epochlens.ablation.settings import MODES, AblationSettings
from epochlens.data.text import TextDataset
from epochlens.device import autocast, model_device
from epochlens.errors import ConfigError, LayerError
from epochlens.in_place import evaluated
from epochlens.models.networks import positions_in
from epochlens.outcome import sample_classes

#: Name endings of the attention output projections (input: the heads' outputs side by side).
HEAD_PROJECTIONS = (
    "attention.output.dense",
    "attn.c_proj",
    "self_attn.o_proj",
    "attention.out_lin",
    "SelfAttention.o",
    "EncDecAttention.o",
    "self_attn.out_proj",
    "encoder_attn.out_proj",
)
#: Name endings of the MLP down projections (input: the intermediate neurons).
MLP_PROJECTIONS = ("output.dense", "mlp.c_proj", "mlp.down_proj", "DenseReluDense.wo", "ffn.lin2", ".fc2")
#: Config keys of the heads per layer: one for every layer, or (BART-family) the encoder's and the
#: decoder's (a decoder site is one with ``decoder`` in its name: its self- and cross-attention).
HEAD_COUNT_KEYS = ("num_attention_heads", "n_head", "num_heads")
SIDE_HEAD_COUNT_KEYS = {"encoder": "encoder_attention_heads", "decoder": "decoder_attention_heads"}


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

    ``num_heads``: heads per layer (default: ``model.config``'s ``encoder_attention_heads`` and
    ``decoder_attention_heads`` for an encoder-decoder that has both (BART: they may differ),
    else its ``num_attention_heads``, ``n_head`` or ``num_heads``)."""
    heads_of = _head_counts(getattr(model, "config", None), num_heads)
    sites = _sites(model, HEAD_PROJECTIONS)
    if not sites:
        raise LayerError(
            f"{type(model).__name__}: no attention output projection found (modules ending in "
            f"{', '.join(HEAD_PROJECTIONS)})."
        )
    out = []
    for layer, (name, module) in enumerate(sites):
        width, heads = _in_features(module), heads_of(name)
        if width % heads:
            raise LayerError(f"{name}: {width} input features do not split into {heads} heads")
        d = width // heads
        out += [UnitSlice(name, layer, f"head {h}", h * d, (h + 1) * d) for h in range(heads)]
    return out


def _head_counts(config: object, num_heads: int | None):
    """Heads per layer as a function of the attention site's name (see :func:`head_sites`)."""
    if num_heads:
        return lambda name: num_heads
    sides = {side: getattr(config, key, None) for side, key in SIDE_HEAD_COUNT_KEYS.items()}
    if all(sides.values()):
        return lambda name: sides["decoder" if "decoder" in name else "encoder"]
    heads = next((getattr(config, k) for k in HEAD_COUNT_KEYS if getattr(config, k, None)), None)
    if not heads:
        raise ConfigError("head ablation needs the number of heads per layer (the model's config has none)")
    return lambda name: heads


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
    keyword inputs with ``attention_mask``), accumulated in float64. A text-to-text model's
    decoder sites (``decoder`` in their name; its batches carry the decoder ``labels``) average
    over the real decoder positions, where the labels are not -100."""
    modules = dict(model.named_modules())
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = dict.fromkeys(sites, 0)  # real tokens seen (Python ints: any device)
    masks: dict[str, torch.Tensor] = {}

    def side(name: str) -> str:
        return "decoder" if "decoder" in masks and "decoder" in name.split(".") else "encoder"

    def make(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:
            x = inputs[0].detach().double()
            real = masks[side(name)].to(x.device)
            s = x[real].sum(0)  # (features,): real tokens only
            sums[name] = s if name not in sums else sums[name] + s
            counts[name] += int(real.sum())

        return hook

    handles = [modules[s].register_forward_pre_hook(make(s)) for s in sites]
    try:
        for batch in batches:
            masks.clear()
            masks["encoder"] = batch["attention_mask"].bool()
            if "labels" in batch:
                masks["decoder"] = batch["labels"] != -100
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return {s: (sums[s] / counts[s]).float() for s in sites}


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


# ---------------------------------------------------------------------------------------------
# The ablation table of a text run's checkpoint


def text_units(model: nn.Module, settings: AblationSettings) -> list[UnitSlice]:
    """This job's share of every attention head and ``channel_groups`` neuron groups of each MLP."""
    mlp = mlp_sites(model, settings.channel_groups) if settings.channel_groups else []
    return settings.share(head_sites(model) + mlp)


def head_ablation_table(
    model: nn.Module,
    data: TextDataset,
    split: str,
    active_classes: np.ndarray | None,
    new_classes: np.ndarray | None,
    settings: AblationSettings,
    mean_samples: int | None = None,
    context: Mapping[str, object] | None = None,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """The ablation table of a text run's checkpoint (the columns of
    :func:`epochlens.ablation.ablate.ablation_table`: ``block`` is the projection, ``group`` the
    head or neuron range, plus ``layer``): every head and MLP neuron group, zero- and/or
    mean-ablated, on the ``split`` sentences (``test`` or ``holdout``) of the active classes, per
    cohort (old, new, all) and, for data with groups, per group (``data: <name>``). Means: over
    the real tokens of up to ``mean_samples`` training sentences (evenly spaced; default: the
    evaluation sentences). A causal LM or text-to-text model (no classes: ``active_classes`` and
    ``new_classes`` unused) has the cohorts ``all`` and its data groups; a text-to-text model's
    heads are its encoder's and decoder's self-attention heads and its cross-attention heads."""
    lm = data.token_labels  # no classes: the cohorts are all and the data groups
    active = np.zeros(1, np.int64) if lm else np.asarray(active_classes, np.int64)
    base = "test" if split == "test" else "train"
    classes = sample_classes(data.labels(base))
    rows_of_split = np.arange(len(classes)) if split == "test" else np.flatnonzero(data.holdout)
    if len(rows_of_split) == 0:
        raise ConfigError(
            "ablation.split: holdout, but the data set has no holdout; set data.holdout_per_class."
        )
    keep = rows_of_split[np.isin(classes[rows_of_split], active)]
    inputs, labels = data.inputs(base, keep), classes[keep]
    cohorts = {} if lm else {"old": ~np.isin(labels, new_classes), "new": np.isin(labels, new_classes)}
    cohorts["all"] = np.ones(len(keep), bool)
    groups = data.groups(base)
    if groups is not None:
        for g, name in enumerate(data.group_names):
            cohorts[f"data: {name}"] = groups[keep] == g
    dev = model_device(model, device)
    with evaluated(model, dev) as net, autocast(dev, settings.precision):  # float32, or 16-bit passes
        units = text_units(net, settings)
        means = None
        if "mean" in settings.modes:
            ref = inputs
            if mean_samples:
                pool = np.flatnonzero(~data.holdout & np.isin(sample_classes(data.train_labels), active))
                take = np.unique(np.linspace(0, len(pool) - 1, min(mean_samples, len(pool))).round()).astype(
                    np.int64
                )
                ref = data.inputs("train", pool[take])
            batches = (
                {k: v[lo : lo + settings.batch_size].to(dev) for k, v in ref.items()}
                for lo in range(0, len(ref["input_ids"]), settings.batch_size)
            )
            means = site_means(net, batches, sorted({u.site for u in units}))
        targets = data.labels(base)[keep] if lm else positions_in(labels, active)
        base = per_sample_outcome(net, inputs, targets, active, settings.batch_size, dev)
        rows = []
        for unit in units:
            for mode in settings.modes:
                with ablated_units(net, unit, mode, means):
                    correct, loss = per_sample_outcome(net, inputs, targets, active, settings.batch_size, dev)
                unit_columns = {
                    "block": unit.site,
                    "group": unit.name,
                    "channel_start": unit.start,
                    "channel_stop": unit.stop,
                    "n_channels": unit.stop - unit.start,
                    "mode": mode,
                }
                for row in cohort_rows({**(context or {}), **unit_columns}, cohorts, base, (correct, loss)):
                    rows.append({**row, "layer": unit.layer})
    return pd.DataFrame(rows)
