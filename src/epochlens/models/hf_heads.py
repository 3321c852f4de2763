"""Which ``model.hf.task`` can load a checkpoint, from its ``config.json`` alone (torch-free: the
workflow checks it while it plans, before any job; transformers' own mappings cost seconds to
import).

A config names its ``model_type`` and, when saved by ``save_pretrained`` or the Trainer, the
class it was saved from (``architectures``, e.g. ``BertForSequenceClassification``,
``GPT2LMHeadModel``, ``T5ForConditionalGeneration``). The head is read off that class name; an
encoder-decoder model (``is_encoder_decoder``, or a known text-to-text family) is a text-to-text
model, which no task of epochlens loads yet.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The class-name endings of each task's head (transformers' naming).
HEAD_SUFFIXES = {
    "sequence_classification": ("ForSequenceClassification",),
    "causal_lm": ("ForCausalLM", "LMHeadModel"),
}
#: model_type of text-to-text (encoder-decoder) families, for configs without is_encoder_decoder.
ENCODER_DECODER_TYPES = frozenset(
    {"t5", "mt5", "umt5", "longt5", "bart", "mbart", "pegasus", "pegasus_x", "marian", "led", "blenderbot",
     "blenderbot-small", "prophetnet", "fsmt", "m2m_100", "switch_transformers", "plbart", "bigbird_pegasus"}
)  # fmt: skip
TEXT_TO_TEXT = "text-to-text (encoder-decoder)"


def checkpoint_heads(config_file: str | Path) -> tuple[str, list[str], str | None]:
    """(model_type, architectures, the task its saved head fits or :data:`TEXT_TO_TEXT`, or None
    when the config names no head) of a ``config.json``."""
    cfg = json.loads(Path(config_file).read_text())
    model_type = str(cfg.get("model_type", "?"))
    archs = [str(a) for a in cfg.get("architectures") or []]
    if cfg.get("is_encoder_decoder") or model_type in ENCODER_DECODER_TYPES:
        return model_type, archs, TEXT_TO_TEXT
    for task, suffixes in HEAD_SUFFIXES.items():
        if any(a.endswith(suffixes) for a in archs):
            return model_type, archs, task
    return model_type, archs, None


def task_problem(config_file: str | Path, task: str) -> str | None:
    """Why ``model.hf.task: task`` cannot load the checkpoint of ``config_file`` (None: it can, or
    the config names no head to judge by)."""
    model_type, archs, fits = checkpoint_heads(config_file)
    saved = f"model_type {model_type!r}" + (f" ({', '.join(archs)})" if archs else "")
    if fits == TEXT_TO_TEXT:
        return (
            f"{config_file} names {saved}, a {TEXT_TO_TEXT} model: model.hf.task {task} cannot load "
            f"it, and text-to-text runs are not available yet (model.hf.task offers "
            f"{', '.join(HEAD_SUFFIXES)})"
        )
    if fits is not None and fits != task:
        return (
            f"{config_file} names {saved}, saved with a {fits} head: set model.hf.task: {fits} (task "
            f"{task} would start from an untrained head, not your model)"
        )
    return None
