"""Settings of a text run's features (torch-free: the workflow reads them while planning).

A text run's features are the hidden states of its transformer's blocks, reduced over the tokens
of each sequence (:mod:`epochlens.features.text`): a sequence classifier's ``mean`` over the real
tokens and ``last`` real token; a language model's (a prompt and its target tokens, whose mean NLL
is the loss) ``prompt_last``, the last prompt token (the position that predicts the first target
token), and ``target_mean``, the mean over the target tokens; a text-to-text (encoder-decoder)
model's ``mean`` and ``first`` of each block over that block's own tokens (an encoder block's: the
prompt's real tokens; a decoder block's: the target positions, teacher-forced). They are stored in the image
features' file format (:mod:`epochlens.features.cache`), so probes read them unchanged; this
module is separate from :mod:`epochlens.features.settings` so that image features jobs do not
depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from epochlens.errors import ConfigError
from epochlens.features.settings import SPLITS

#: Bump when the meaning of stored text features changes: old caches rebuild.
TEXT_FORMAT_VERSION = 1
TEXT_REPRESENTATIONS = ("mean", "last")
#: A language model's representations: they need each sequence's token labels (-100: no target).
LM_REPRESENTATIONS = ("prompt_last", "target_mean")
#: A text-to-text model's: the mean over a block's own tokens and its first (Sentence-T5's two
#: poolings: T5 has no CLS token), encoder blocks over the prompt, decoder blocks over the target.
SEQ2SEQ_REPRESENTATIONS = ("mean", "first")
#: The representations each kind of text data takes (:class:`epochlens.data.text.TextDataset.kind`).
KIND_REPRESENTATIONS = {
    "classification": TEXT_REPRESENTATIONS,
    "causal_lm": LM_REPRESENTATIONS,
    "text_to_text": SEQ2SEQ_REPRESENTATIONS,
}


@dataclass
class TextFeatureSettings:
    """What is extracted from each checkpoint of a text run and how it is stored."""

    layers: list[str] | None = field(
        default=None,
        metadata={
            "help": "module names to hook (as in model.named_modules()); None: every transformer "
            "block's output (BERT: bert.encoder.layer.N; GPT-2: transformer.h.N; T5: the encoder's, "
            "and the decoder's for text-to-text data)"
        },
    )
    names: tuple[str, ...] = field(
        default=TEXT_REPRESENTATIONS,
        metadata={
            "help": "mean (over the real tokens) and/or last (the last real token); a language "
            "model's prompt_last (last prompt token) and/or target_mean (mean over the target "
            "tokens); a text-to-text model's mean and/or first (the first token) of each block's "
            "own tokens (encoder: the prompt's; decoder: the target positions)"
        },
    )
    dtype: Literal["float32", "float16"] = field(
        default="float32", metadata={"help": "storage dtype of the features"}
    )
    splits: tuple[str, ...] = field(default=SPLITS, metadata={"help": "data splits to extract"})
    batch_size: int = field(default=256, metadata={"help": "sequences per forward pass", "execution": True})
    compression: Literal["gzip", "lzf", "none"] = field(
        default="gzip", metadata={"help": "HDF5 filter", "execution": True}
    )
    compression_level: int = field(default=4, metadata={"help": "gzip level 1-9", "execution": True})

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            self.layers = [self.layers]
        if self.layers is not None:
            self.layers = list(self.layers)
        self.names, self.splits = tuple(self.names), tuple(self.splits)
        problems = []
        if self.layers is not None and (not self.layers or len(set(self.layers)) != len(self.layers)):
            problems.append(f"layers {self.layers} must be distinct module names (null: the blocks)")
        known = (*TEXT_REPRESENTATIONS, "first", *LM_REPRESENTATIONS)
        bad = [n for n in self.names if n not in known]
        if bad or not self.names or len(set(self.names)) != len(self.names):
            problems.append(f"representations {list(self.names)} must be distinct of {list(known)}")
        if self.dtype not in ("float32", "float16"):
            problems.append(f"dtype={self.dtype!r} must be float32 or float16")
        if (
            not self.splits
            or any(s not in SPLITS for s in self.splits)
            or len(set(self.splits)) != len(self.splits)
        ):
            problems.append(f"splits={list(self.splits)} must be distinct values of {list(SPLITS)}")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if self.compression not in ("gzip", "lzf", "none") or not 1 <= self.compression_level <= 9:
            problems.append("compression must be gzip, lzf or none, compression_level 1..9")
        if problems:
            raise ConfigError("text feature settings: " + "; ".join(problems) + ". Fix the config.")

    def spec(self) -> dict:
        """What the stored values depend on besides checkpoint and data (part of the cache key)."""
        return {
            "format_version": TEXT_FORMAT_VERSION,
            "kind": "text",
            "layers": "default_blocks" if self.layers is None else list(self.layers),
            "representations": {"names": list(self.names)},
            "dtype": self.dtype,
            "splits": list(self.splits),
        }


def text_feature_params(run: Mapping) -> dict:
    """A text run's features params (what the cache key's spec holds): its layers and dtype; the
    representations are always ``mean`` and ``last``, a language model's (data with a
    ``target_column``) ``prompt_last`` and ``target_mean``, a text-to-text model's
    (``model.hf.task: text_to_text``) ``mean`` and ``first`` (``features.representations`` and the
    spectral keys are for images)."""
    spec = run["features"]
    lm = bool(run.get("data", {}).get("text", {}).get("target_column"))
    seq2seq = run.get("model", {}).get("hf", {}).get("task") == "text_to_text"
    names = SEQ2SEQ_REPRESENTATIONS if seq2seq else LM_REPRESENTATIONS if lm else TEXT_REPRESENTATIONS
    settings = TextFeatureSettings(
        layers=spec.get("layers"),
        names=names,
        dtype=spec.get("dtype", "float32"),
    )
    return {
        "layers": settings.layers,
        "representations": {"names": list(settings.names)},
        "dtype": settings.dtype,
    }
