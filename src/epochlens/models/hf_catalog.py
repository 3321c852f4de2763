"""Where the blocks, attention heads and MLPs of Hugging Face transformers are, without torch.

The stages that look inside a transformer (features per block, ablation of attention heads and MLP
neuron groups, influence on its linear layers, curvature with respect to the input embeddings)
need module names as in ``model.named_modules()``. They depend on the family
(``config.model_type``) and on the head the checkpoint was saved with (``config.architectures``):
GPT-2's blocks are ``h.{i}`` of the base model, which sits under ``transformer`` in
``GPT2LMHeadModel`` and ``GPT2ForSequenceClassification`` but at the top of ``GPT2Model``.

:data:`FAMILIES` holds, per ``model_type``, the names relative to the base model;
:func:`layout_from_config` resolves them for one ``config.json`` (a dict, the file or its folder)
into an :class:`HFLayout` of concrete names, reading JSON only, so the workflow can check a
configuration while it plans; :func:`layout_of` does the same for a built model and checks that
every name exists. A unit test builds a tiny model of every family and compares.

Attention heads: the attention output projection (``attention_outputs[i]``) is a linear map (or
GPT-2's ``Conv1D``) whose *input* is the concatenation of the heads' outputs, head ``h`` occupying
features ``[h * head_dim, (h + 1) * head_dim)`` (:meth:`HFLayout.head_slice`). Zeroing (or
replacing by its mean) that slice of the projection's input ablates head ``h`` of block ``i``;
a forward pre-hook on the projection does it. MLP neurons likewise: the input of
``mlp_outputs[i]`` (the down projection) holds the ``mlp_width`` neurons after the nonlinearity
(after the gate, for gated MLPs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochlens.errors import ConfigError


@dataclass(frozen=True)
class Stack:
    """A stack of identical blocks (a decoder, an encoder), names relative to the base model.

    Attributes:
        name: ``"decoder"``, ``"encoder"`` (T5 has both).
        blocks: the ModuleList of blocks; block ``i`` is ``f"{blocks}.{i}"``.
        layers_key: config key(s) of the number of blocks, first present and not null wins.
        attention: the self-attention module, relative to a block.
        attention_output: the projection whose input is the concatenated heads, relative to a block.
        mlp: the MLP (feed-forward) module, relative to a block.
        mlp_output: the down projection whose input is the MLP's neurons, relative to a block.
        final_norm: the norm after the last block, relative to the base model (None: none).
    """

    name: str
    blocks: str
    layers_key: tuple[str, ...]
    attention: str
    attention_output: str
    mlp: str
    mlp_output: str
    final_norm: str | None = None


@dataclass(frozen=True)
class Family:
    """Module names and config keys of one ``model_type``.

    Attributes:
        model_type: ``config.model_type`` (``"gpt2"``, ``"bert"``, ``"llama"``, ...).
        base_prefix: attribute that holds the base model in head models (``base_model_prefix``).
        stacks: the stacks of blocks, in forward order.
        hidden_key, heads_key: config keys of the hidden size and of the number of attention heads.
        head_dim_key: config key of the per-head width when it is not hidden / heads (T5's ``d_kv``).
        mlp_width_key: config key of the MLP width; None or a null value: ``mlp_width_factor`` x hidden.
        embeddings: the token embedding (``nn.Embedding``), relative to the base model.
        heads: module of each head kind at the top of the head model (``sequence_classification``,
            ``causal_lm``), as named in the Hugging Face classes.
        bare: architectures that are the base model itself (no prefix).
        unprefixed: head architectures that hold the base model's modules directly (T5's
            ``T5ForConditionalGeneration``: ``encoder``, ``decoder``, ``lm_head``).
        encoder_only: architectures that have only the first stack (``T5EncoderModel``).
        projection: ``"linear"`` (``nn.Linear``, weight (out, in)) or ``"conv1d"`` (GPT-2's
            ``Conv1D``, weight (in, out)): the type of the attention and MLP projections.
        causal: True for decoder-only families (the last real token sees the whole sequence).
    """

    model_type: str
    base_prefix: str
    stacks: tuple[Stack, ...]
    hidden_key: tuple[str, ...]
    heads_key: tuple[str, ...]
    embeddings: str
    heads: Mapping[str, str]
    head_dim_key: tuple[str, ...] = ()
    mlp_width_key: tuple[str, ...] = ()
    mlp_width_factor: int = 4
    bare: tuple[str, ...] = ()
    unprefixed: tuple[str, ...] = ()
    encoder_only: tuple[str, ...] = ()
    projection: str = "linear"
    causal: bool = False


def _bert_like(model_type: str, arch: str) -> Family:
    return Family(
        model_type=model_type,
        base_prefix=model_type,
        stacks=(
            Stack(
                name="encoder",
                blocks="encoder.layer",
                layers_key=("num_hidden_layers",),
                attention="attention",
                attention_output="attention.output.dense",
                mlp="intermediate",  # dense + activation; the neurons feed output.dense
                mlp_output="output.dense",
            ),
        ),
        hidden_key=("hidden_size",),
        heads_key=("num_attention_heads",),
        mlp_width_key=("intermediate_size",),
        embeddings="embeddings.word_embeddings",
        heads={"sequence_classification": "classifier"},
        bare=(f"{arch}Model",),
    )


def _llama_like(model_type: str, arch: str) -> Family:
    return Family(
        model_type=model_type,
        base_prefix="model",
        stacks=(
            Stack(
                name="decoder",
                blocks="layers",
                layers_key=("num_hidden_layers",),
                attention="self_attn",
                attention_output="self_attn.o_proj",
                mlp="mlp",
                mlp_output="mlp.down_proj",
                final_norm="norm",
            ),
        ),
        hidden_key=("hidden_size",),
        heads_key=("num_attention_heads",),
        head_dim_key=("head_dim",),
        mlp_width_key=("intermediate_size",),
        embeddings="embed_tokens",
        heads={"sequence_classification": "score", "causal_lm": "lm_head"},
        bare=(f"{arch}Model",),
        causal=True,
    )


#: Supported families by ``config.model_type``.
FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        model_type="gpt2",
        base_prefix="transformer",
        stacks=(
            Stack(
                name="decoder",
                blocks="h",
                layers_key=("n_layer",),
                attention="attn",
                attention_output="attn.c_proj",
                mlp="mlp",
                mlp_output="mlp.c_proj",
                final_norm="ln_f",
            ),
        ),
        hidden_key=("n_embd",),
        heads_key=("n_head",),
        mlp_width_key=("n_inner",),
        embeddings="wte",
        heads={"sequence_classification": "score", "causal_lm": "lm_head"},
        bare=("GPT2Model",),
        projection="conv1d",
        causal=True,
    ),
    "bert": _bert_like("bert", "Bert"),
    "roberta": _bert_like("roberta", "Roberta"),
    "distilbert": Family(
        model_type="distilbert",
        base_prefix="distilbert",
        stacks=(
            Stack(
                name="encoder",
                blocks="transformer.layer",
                layers_key=("n_layers",),
                attention="attention",
                attention_output="attention.out_lin",
                mlp="ffn",
                mlp_output="ffn.lin2",
            ),
        ),
        hidden_key=("dim",),
        heads_key=("n_heads",),
        mlp_width_key=("hidden_dim",),
        embeddings="embeddings.word_embeddings",
        heads={"sequence_classification": "classifier"},
        bare=("DistilBertModel",),
    ),
    "llama": _llama_like("llama", "Llama"),
    "mistral": _llama_like("mistral", "Mistral"),
    "qwen2": _llama_like("qwen2", "Qwen2"),
    "t5": Family(
        model_type="t5",
        base_prefix="transformer",
        stacks=(
            Stack(
                name="encoder",
                blocks="encoder.block",
                layers_key=("num_layers",),
                attention="layer.0.SelfAttention",
                attention_output="layer.0.SelfAttention.o",
                mlp="layer.1.DenseReluDense",
                mlp_output="layer.1.DenseReluDense.wo",
                final_norm="encoder.final_layer_norm",
            ),
            Stack(
                name="decoder",
                blocks="decoder.block",
                layers_key=("num_decoder_layers", "num_layers"),
                attention="layer.0.SelfAttention",  # layer.1 is the cross-attention
                attention_output="layer.0.SelfAttention.o",
                mlp="layer.2.DenseReluDense",
                mlp_output="layer.2.DenseReluDense.wo",
                final_norm="decoder.final_layer_norm",
            ),
        ),
        hidden_key=("d_model",),
        heads_key=("num_heads",),
        head_dim_key=("d_kv",),
        mlp_width_key=("d_ff",),
        embeddings="shared",
        heads={"sequence_classification": "classification_head", "text_to_text": "lm_head"},
        bare=("T5Model", "T5EncoderModel"),
        unprefixed=("T5ForConditionalGeneration",),
        encoder_only=("T5EncoderModel", "T5ForTokenClassification"),
    ),
}


@dataclass(frozen=True)
class HFLayout:
    """Concrete module names of one model (see the module doc); every list has one entry per block.

    Attributes:
        model_type: ``config.model_type``.
        architecture: ``config.architectures[0]`` (None when the config names none).
        prefix: where the base model sits (``"transformer"``, ``""`` for a bare base model).
        blocks: every block, in forward order (encoder blocks before decoder blocks).
        stacks: the stack (``"encoder"``/``"decoder"``) of each block.
        attentions, attention_outputs, mlps, mlp_outputs: per block (see :class:`Stack`).
        embeddings: the token embedding module.
        final_norms: the norms after the last block of each stack.
        head: the task head of the architecture (None when unknown, e.g. a bare base model).
        num_heads, head_dim, hidden_size, mlp_width: attention heads per block, their width, the
            residual width and the MLP width.
        projection: ``"linear"`` or ``"conv1d"`` (see :class:`Family`).
        causal: decoder-only family.
    """

    model_type: str
    architecture: str | None
    prefix: str
    blocks: list[str]
    stacks: list[str]
    attentions: list[str]
    attention_outputs: list[str]
    mlps: list[str]
    mlp_outputs: list[str]
    embeddings: str
    final_norms: list[str]
    head: str | None
    num_heads: int
    head_dim: int
    hidden_size: int
    mlp_width: int
    projection: str
    causal: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def head_slice(self, head: int) -> tuple[int, int]:
        """``(start, stop)`` of head ``head``'s features in the attention output projection's input."""
        if not 0 <= head < self.num_heads:
            raise ConfigError(f"head {head} out of range: {self.model_type} blocks have {self.num_heads}")
        return head * self.head_dim, (head + 1) * self.head_dim

    def all_names(self) -> list[str]:
        """Every module name the layout refers to (for checks against ``named_modules()``)."""
        names = [*self.blocks, *self.attentions, *self.attention_outputs, *self.mlps, *self.mlp_outputs]
        names += [self.embeddings, *self.final_norms]
        return names + ([self.head] if self.head else [])


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def family(model_type: str) -> Family:
    """The :class:`Family` of a ``model_type``; ConfigError listing the supported ones."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ConfigError(
            f"model_type {model_type!r} is not in epochlens' catalog of transformer families "
            f"({supported_model_types()}); name the layers in the config (module names as in "
            "model.named_modules()), or add the family to epochlens.models.hf_catalog.FAMILIES."
        ) from None


def read_config(config: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A model's config as a dict: given as one, or read from ``config.json`` or its folder."""
    if isinstance(config, Mapping):
        return dict(config)
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no config.json. A Hugging Face model folder (save_pretrained or a Trainer "
            "checkpoint-{step} folder) holds one; point the config at such a folder."
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable config.json ({exc}).") from exc


def _get(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        if cfg.get(k) is not None:
            return int(cfg[k])
    return None


def _need(cfg: Mapping[str, Any], keys: tuple[str, ...], what: str, model_type: str) -> int:
    value = _get(cfg, keys)
    if value is None:
        raise ConfigError(
            f"the {model_type} config has no {what} (looked for {list(keys)}); it is not a complete "
            "config.json of this model type."
        )
    return value


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def layout_from_config(
    config: Mapping[str, Any] | str | Path,
    architecture: str | None = None,
    head_kind: str | None = None,
) -> HFLayout:
    """Resolve the module names of a model from its config (torch-free).

    Args:
        config: the config as a dict, a ``config.json`` or the folder holding it.
        architecture: the model class name; default ``config["architectures"][0]``. Without one,
            a head model (base model under ``base_prefix``) is assumed.
        head_kind: ``"sequence_classification"`` or ``"causal_lm"`` etc.: names the head when the
            architecture does not say (e.g. a model built by ``from_config`` for that task).

    Raises:
        ConfigError: an unsupported ``model_type`` or a config without the sizes.
    """
    cfg = read_config(config)
    model_type = cfg.get("model_type")
    if not model_type:
        raise ConfigError(f"{config}: the config has no model_type; it is not a Hugging Face config.json.")
    fam = family(str(model_type))
    arch = architecture or (cfg.get("architectures") or [None])[0]
    prefix = "" if arch in fam.bare or arch in fam.unprefixed else fam.base_prefix
    stacks = fam.stacks[:1] if arch in fam.encoder_only else fam.stacks
    blocks, stack_of, attn, attn_out, mlp, mlp_out, norms = [], [], [], [], [], [], []
    for stack in stacks:
        n = _need(cfg, stack.layers_key, "number of layers", fam.model_type)
        for i in range(n):
            block = _join(prefix, f"{stack.blocks}.{i}")
            blocks.append(block)
            stack_of.append(stack.name)
            attn.append(_join(block, stack.attention))
            attn_out.append(_join(block, stack.attention_output))
            mlp.append(_join(block, stack.mlp))
            mlp_out.append(_join(block, stack.mlp_output))
        if stack.final_norm:
            norms.append(_join(prefix, stack.final_norm))
    hidden = _need(cfg, fam.hidden_key, "hidden size", fam.model_type)
    heads = _need(cfg, fam.heads_key, "number of attention heads", fam.model_type)
    head_dim = _get(cfg, fam.head_dim_key) or hidden // heads
    mlp_width = _get(cfg, fam.mlp_width_key) or fam.mlp_width_factor * hidden
    kind = head_kind or _head_kind(arch)
    head = None if arch in fam.bare else fam.heads.get(kind) if kind else None
    return HFLayout(
        model_type=fam.model_type,
        architecture=arch,
        prefix=prefix,
        blocks=blocks,
        stacks=stack_of,
        attentions=attn,
        attention_outputs=attn_out,
        mlps=mlp,
        mlp_outputs=mlp_out,
        embeddings=_join(prefix, fam.embeddings),
        final_norms=norms,
        head=head,
        num_heads=heads,
        head_dim=head_dim,
        hidden_size=hidden,
        mlp_width=mlp_width,
        projection=fam.projection,
        causal=fam.causal,
    )


def _head_kind(architecture: str | None) -> str | None:
    if not architecture:
        return None
    for suffix, kind in (
        ("ForSequenceClassification", "sequence_classification"),
        ("ForCausalLM", "causal_lm"),
        ("LMHeadModel", "causal_lm"),
        ("ForConditionalGeneration", "text_to_text"),
        ("ForMaskedLM", "masked_lm"),
    ):
        if architecture.endswith(suffix):
            return kind
    return None


def layout_of(model: Any) -> HFLayout:
    """The :class:`HFLayout` of a built ``transformers`` model, checked against its modules.

    Raises:
        ConfigError: an unsupported family, or names the model does not have (listing them).
    """
    cfg = model.config.to_dict()
    layout = layout_from_config(cfg, architecture=type(model).__name__)
    names = {n for n, _ in model.named_modules()}
    missing = [n for n in layout.all_names() if n not in names]
    if missing:
        raise ConfigError(
            f"{type(model).__name__}: the catalog's module names {missing[:6]} are not in the model "
            f"(it has e.g. {sorted(names)[:12]}); this version of transformers names its modules "
            "differently: name the layers in the config."
        )
    return layout


__all__ = [
    "FAMILIES",
    "Family",
    "HFLayout",
    "Stack",
    "family",
    "layout_from_config",
    "layout_of",
    "read_config",
    "supported_model_types",
]
