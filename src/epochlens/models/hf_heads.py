"""Which ``model.hf.task`` can load a checkpoint, from its ``config.json`` alone (torch-free: the
workflow checks it while it plans, before any job; transformers' own mappings cost seconds to
import).

A config names its ``model_type`` and, when saved by ``save_pretrained`` or the Trainer, the
class it was saved from (``architectures``, e.g. ``BertForSequenceClassification``,
``GPT2LMHeadModel``, ``T5ForConditionalGeneration``). The head is read off that class name; a
config that names none is judged by its family: an encoder-decoder model (``is_encoder_decoder``,
or a known text-to-text family) is a ``text_to_text`` model, and ``text_to_text`` loads nothing
else.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The class-name endings of each task's head (transformers' naming), text-to-text first
#: (T5WithLMHeadModel is an encoder-decoder).
HEAD_SUFFIXES = {
    "text_to_text": ("ForConditionalGeneration", "WithLMHeadModel", "MTModel"),
    "sequence_classification": ("ForSequenceClassification",),
    "causal_lm": ("ForCausalLM", "LMHeadModel"),
}
#: model_type of text-to-text (encoder-decoder) families, for configs without is_encoder_decoder.
ENCODER_DECODER_TYPES = frozenset(
    {"t5", "mt5", "umt5", "longt5", "bart", "mbart", "pegasus", "pegasus_x", "marian", "led", "blenderbot",
     "blenderbot-small", "prophetnet", "fsmt", "m2m_100", "switch_transformers", "plbart", "bigbird_pegasus"}
)  # fmt: skip
TEXT_TO_TEXT = "text_to_text"


def checkpoint_heads(config_file: str | Path) -> tuple[str, list[str], str | None]:
    """(model_type, architectures, the task its saved head fits, or None when the config names no
    head) of a ``config.json``; an encoder-decoder config without a head fits ``text_to_text``."""
    cfg = json.loads(Path(config_file).read_text())
    model_type = str(cfg.get("model_type", "?"))
    archs = [str(a) for a in cfg.get("architectures") or []]
    for task, suffixes in HEAD_SUFFIXES.items():
        if any(a.endswith(suffixes) for a in archs):
            return model_type, archs, task
    if is_encoder_decoder(cfg):
        return model_type, archs, TEXT_TO_TEXT
    return model_type, archs, None


def is_encoder_decoder(cfg: dict) -> bool:
    """Whether a ``config.json``'s mapping describes an encoder-decoder model."""
    return bool(cfg.get("is_encoder_decoder")) or str(cfg.get("model_type")) in ENCODER_DECODER_TYPES


def task_problem(config_file: str | Path, task: str) -> str | None:
    """Why ``model.hf.task: task`` cannot load the checkpoint of ``config_file`` (None: it can, or
    the config names no head to judge by), naming the task that fits."""
    model_type, archs, fits = checkpoint_heads(config_file)
    saved = f"model_type {model_type!r}" + (f" ({', '.join(archs)})" if archs else "")
    if fits == TEXT_TO_TEXT and task != TEXT_TO_TEXT:
        return (
            f"{config_file} names {saved}, a text-to-text (encoder-decoder) model: model.hf.task "
            f"{task} cannot load it; set model.hf.task: text_to_text (with data.text prompt_column and "
            "target_column: the encoder's input and the decoder's target)"
        )
    if task == TEXT_TO_TEXT and fits != TEXT_TO_TEXT:
        # Without a head named, the config is not an encoder-decoder one (else it would fit).
        return (
            f"{config_file} names {saved}, not an encoder-decoder model: model.hf.task text_to_text "
            "loads AutoModelForSeq2SeqLM models (T5, BART, ...); set model.hf.task: "
            f"{fits or 'sequence_classification or causal_lm'}"
        )
    if fits is not None and fits != task:
        return (
            f"{config_file} names {saved}, saved with a {fits} head: set model.hf.task: {fits} (task "
            f"{task} would start from an untrained head, not your model)"
        )
    return None
