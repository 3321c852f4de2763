"""Tiny Hugging Face configs (:func:`tiny_config`) of the families in :data:`TINY_FAMILIES`: the models
of the demo and the tests (written by :func:`epochlens.models.hf.write_tiny_model`).
"""

from __future__ import annotations

from epochlens.errors import ConfigError

#: Families :func:`tiny_config` can make, and the head kinds each supports.
TINY_FAMILIES: dict[str, tuple[str, ...]] = {
    "bert": ("sequence_classification",),
    "roberta": ("sequence_classification",),
    "distilbert": ("sequence_classification",),
    "gpt2": ("sequence_classification", "causal_lm"),
    "llama": ("sequence_classification", "causal_lm"),
    "mistral": ("sequence_classification", "causal_lm"),
    "qwen2": ("sequence_classification", "causal_lm"),
    "t5": ("sequence_classification", "text_to_text"),
}


def tiny_config(
    model_type: str,
    vocab_size: int,
    num_labels: int = 2,
    pad_token_id: int | None = 0,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    max_positions: int = 64,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    mlp_width: int = 64,
    dropout: float = 0.0,
):
    """A tiny ``PretrainedConfig`` of ``model_type`` (see :data:`TINY_FAMILIES`).

    Dropout is off by default: per-sample analyses run in eval mode anyway, and training without
    dropout is a function of the seed and the batch order only. T5 needs ``eos_token_id`` (its
    classifier reads the last eos token of each sequence).
    """
    import transformers as tf

    special = dict(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    common = dict(vocab_size=vocab_size, num_labels=num_labels, **special)
    if model_type not in _TINY_SIZES:
        raise ConfigError(f"tiny_config: model_type {model_type!r} must be one of {sorted(TINY_FAMILIES)}.")
    if model_type == "t5" and eos_token_id is None:
        raise ConfigError("a tiny T5 needs eos_token_id (its classifier reads the last eos token).")
    class_name, sizes = _TINY_SIZES[model_type]
    kwargs = sizes(hidden, layers, heads, mlp_width, max_positions, dropout)
    if model_type == "roberta":  # RoBERTa's positions start after the pad id: room for it.
        kwargs["max_position_embeddings"] += 2
    if model_type == "t5":
        kwargs["decoder_start_token_id"] = pad_token_id if pad_token_id is not None else 0
    return getattr(tf, class_name)(**kwargs, **common)


def _bert_sizes(hidden, layers, heads, mlp_width, max_positions, dropout) -> dict:
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=mlp_width,
        max_position_embeddings=max_positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


def _distilbert_sizes(hidden, layers, heads, mlp_width, max_positions, dropout) -> dict:
    return dict(
        dim=hidden,
        n_layers=layers,
        n_heads=heads,
        hidden_dim=mlp_width,
        max_position_embeddings=max_positions,
        dropout=dropout,
        attention_dropout=dropout,
        seq_classif_dropout=dropout,
    )


def _gpt2_sizes(hidden, layers, heads, mlp_width, max_positions, dropout) -> dict:
    return dict(
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_inner=mlp_width,
        n_positions=max_positions,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        summary_first_dropout=dropout,
    )


def _llama_sizes(hidden, layers, heads, mlp_width, max_positions, dropout) -> dict:
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=mlp_width,
        max_position_embeddings=max_positions,
        attention_dropout=dropout,
    )


def _t5_sizes(hidden, layers, heads, mlp_width, max_positions, dropout) -> dict:
    return dict(
        d_model=hidden,
        d_kv=hidden // heads,
        d_ff=mlp_width,
        num_layers=layers,
        num_heads=heads,
        dropout_rate=dropout,
    )


#: Per family of :func:`tiny_config`: the transformers config class and its size arguments.
_TINY_SIZES = {
    "bert": ("BertConfig", _bert_sizes),
    "roberta": ("RobertaConfig", _bert_sizes),
    "distilbert": ("DistilBertConfig", _distilbert_sizes),
    "gpt2": ("GPT2Config", _gpt2_sizes),
    "llama": ("LlamaConfig", _llama_sizes),
    "mistral": ("MistralConfig", _llama_sizes),
    "qwen2": ("Qwen2Config", _llama_sizes),
    "t5": ("T5Config", _t5_sizes),
}
