"""How a text run's data is read and tokenised: the ``data.text`` section of its config
(:class:`TextSettings`; read by :mod:`epochlens.formats.text`, tokenised by
:mod:`epochlens.formats.tokens`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from epochlens.errors import ConfigError


@dataclass
class TextSettings:
    """How text data is read and tokenised (the ``data.text`` section of a text run)."""

    text_column: str = field(default="text", metadata={"help": "column of the texts (classification)"})
    label_column: str = field(default="label", metadata={"help": "column of the class ids or names"})
    prompt_column: str | None = field(
        default=None, metadata={"help": "causal LM: column of the prompts (with target_column)"}
    )
    target_column: str | None = field(
        default=None, metadata={"help": "causal LM: column of the targets, whose tokens the loss counts"}
    )
    group_column: str | None = field(default=None, metadata={"help": "column of each sample's cohort"})
    ground_truth_column: str | None = field(
        default=None, metadata={"help": "boolean column: True for each poisoned training sample"}
    )
    split_column: str | None = field(default=None, metadata={"help": "column naming each row's split"})
    train_split: str = field(default="train", metadata={"help": "name of the training split"})
    test_split: str = field(default="test", metadata={"help": "name of the test split"})
    max_length: int = field(default=128, metadata={"help": "tokens per sample at most (truncated)"})
    padding: Literal["longest", "max_length"] = field(
        default="longest", metadata={"help": "pad to the longest sample of both splits, or to max_length"}
    )
    pad_token: str | None = field(
        default=None, metadata={"help": "the pad token, for a tokenizer without one (e.g. its eos token)"}
    )
    name: str | None = field(default=None, metadata={"help": "data set name; None: the file or folder name"})
    encoder_decoder: bool = field(
        default=False,
        metadata={"help": "text_to_text model: the prompt is the encoder input, the target the labels"},
    )
    section = "data.text"  # where these settings are in the config (for messages)

    def __post_init__(self) -> None:
        problems = []
        if (self.prompt_column is None) != (self.target_column is None):
            problems.append("prompt_column and target_column go together (a causal LM's samples)")
        if self.encoder_decoder and self.target_column is None:
            problems.append(
                "a text-to-text model (model.hf.task: text_to_text) needs prompt_column and target_column"
            )
        if self.max_length < 2:
            problems.append(f"max_length={self.max_length} must be >= 2")
        if self.padding not in ("longest", "max_length"):
            problems.append(f"padding={self.padding!r} must be longest or max_length")
        if self.train_split == self.test_split:
            problems.append(f"train_split and test_split are both {self.train_split!r}")
        if problems:
            raise ConfigError("data.text: " + "; ".join(problems) + ". Fix the config.")

    @property
    def kind(self) -> Literal["classification", "causal_lm", "text_to_text"]:
        if self.target_column is None:
            return "classification"
        return "text_to_text" if self.encoder_decoder else "causal_lm"

    @property
    def split_names(self) -> dict[str, str]:
        return {"train": self.train_split, "test": self.test_split}

    def columns(self) -> list[str]:
        if self.target_column is not None:
            cols = [self.prompt_column, self.target_column]
        else:
            cols = [self.text_column, self.label_column]
        return [c for c in [*cols, self.group_column, self.ground_truth_column] if c]
