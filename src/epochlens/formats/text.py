"""Text data in the layouts users have, tokenised into :class:`epochlens.data.text.TextDataset`.

Layouts (``source``): ``jsonl``, ``csv``, ``parquet`` (one file with a split column, or a folder
with ``train.<ext>`` and ``test.<ext>``, split names from the settings) and ``save_to_disk`` (a
``datasets`` DatasetDict, or one Dataset with a split column).

Columns: classification reads ``text_column`` and ``label_column`` (class ids, or names sorted as
for image folders, or a ``ClassLabel``'s names); a causal language model reads ``prompt_column``
and ``target_column``: the sample is the prompt followed by the target, and only the target's
tokens are predicted (its per-sample loss is the mean NLL of the target tokens). The optional
``group_column`` gives each sample's cohort (e.g. the prompt set).

A text-to-text (encoder-decoder) model (``encoder_decoder``: ``model.hf.task: text_to_text``)
reads the same two columns: the prompt, tokenised as the tokenizer encodes any text (a T5
tokenizer appends its eos token), is the encoder's input; the target, tokenised as a target
(``text_target``) and ending with the tokenizer's eos token (appended when the tokenizer does
not add it), is the decoder's labels (N, T), padded with -100 as transformers' collators do.

Tokenisation: the tokenizer of a local folder (``tokenizer.json`` / vocab files, as
``save_pretrained`` writes them; nothing is downloaded), truncation to ``max_length`` (a causal
LM's prompt is cut from the left, its target kept whole), padding on the tokenizer's side to the
longest sample of both splits (``padding: longest``) or to ``max_length``; a classifier's texts a
chunk at a time (:mod:`epochlens.formats.tokens`). The tokenizer's files are fingerprinted into
the data set's content hash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from epochlens.data.text import TextDataset
from epochlens.errors import ConfigError
from epochlens.formats.image_decode import encode_values
from epochlens.formats.tables import TABLE_SOURCES, flags_of, read_tables
from epochlens.formats.tokens import load_tokenizer, tokenize_splits, tokenizer_fingerprint

TEXT_SOURCES = TABLE_SOURCES


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


def load_text(
    source: str,
    path: str | Path,
    settings: TextSettings,
    tokenizer_folder: str | Path,
) -> TextDataset:
    """Read, tokenise and assemble a text data set (classification, causal LM or text-to-text)."""
    tables, label_names = read_tables(source, path, settings)
    name = settings.name or Path(path).stem
    return text_dataset(tables, label_names, settings, tokenizer_folder, name, f"{source}:{path}")


def source_tokenizer(source: str, settings: TextSettings, folder: str | Path | None) -> Any:
    """The tokenizer that :func:`load_text` (``folder``) or :func:`load_polarity` (its own) used."""
    if source != "polarity":
        return load_tokenizer(folder, settings.pad_token)
    import tempfile

    from epochlens.data.polarity import write_polarity_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        return load_tokenizer(write_polarity_tokenizer(Path(tmp) / "polarity-tokenizer"), settings.pad_token)


def load_polarity(settings: TextSettings, train: int = 600, test: int = 200, seed: int = 0) -> TextDataset:
    """The synthetic polarity data set (:mod:`epochlens.data.polarity`), tokenised by its own
    word-level tokenizer (written to a temporary folder: its fingerprint is the vocabulary's)."""
    import tempfile

    from epochlens.data.polarity import CLASS_NAMES, polarity_tables, write_polarity_tokenizer

    settings = dataclasses.replace(settings, text_column="text", label_column="label", group_column="group")
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_polarity_tokenizer(Path(tmp) / "polarity-tokenizer")  # a fixed name: hashed
        return text_dataset(
            polarity_tables(train, test, seed),
            list(CLASS_NAMES),
            settings,
            folder,
            "polarity",
            f"polarity(train={train}, test={test}, seed={seed})",
        )


def text_dataset(
    tables: Mapping[str, pd.DataFrame],
    label_names: list[str] | None,
    settings: TextSettings,
    tokenizer_folder: str | Path,
    name: str,
    origin: str,
) -> TextDataset:
    """Tokenise ``{"train": df, "test": df}`` and assemble the data set (``label_names``: the
    class names in id order, or None to sort the label column's names)."""
    tokenizer = load_tokenizer(tokenizer_folder, settings.pad_token)
    tokens = tokenize_splits(tokenizer, tables, settings)
    if settings.kind == "classification":
        labels, class_names = encode_values(
            {s: df[settings.label_column].tolist() for s, df in tables.items()},
            label_names, "label", settings.label_column, origin,
        )  # fmt: skip
        labels = {s: labels[s] for s in tables}
    else:
        labels, class_names = {s: tokens[s]["labels"] for s in tables}, []
    groups, group_names = None, []
    if settings.group_column:
        groups, group_names = encode_values(
            {s: df[settings.group_column].tolist() for s, df in tables.items()},
            None, "group", settings.group_column, origin,
        )  # fmt: skip
    if settings.kind == "classification":
        texts = {s: [str(t) for t in df[settings.text_column]] for s, df in tables.items()}
    else:  # a causal LM's sequence; a text-to-text model's input and target, space-joined as well
        texts = {
            s: [
                f"{p} {t}"
                for p, t in zip(df[settings.prompt_column], df[settings.target_column], strict=True)
            ]
            for s, df in tables.items()
        }
    return TextDataset(
        name=settings.name or name,
        source=origin,
        kind=settings.kind,
        train_input_ids=tokens["train"]["input_ids"],
        train_attention_mask=tokens["train"]["attention_mask"],
        train_labels=labels["train"],
        test_input_ids=tokens["test"]["input_ids"],
        test_attention_mask=tokens["test"]["attention_mask"],
        test_labels=labels["test"],
        num_classes=len(class_names),
        class_names=class_names,
        train_groups=None if groups is None else groups["train"],
        test_groups=None if groups is None else groups["test"],
        group_names=group_names,
        tokenizer=tokenizer_fingerprint(tokenizer_folder),
        pad_token_id=int(tokenizer.pad_token_id),
        vocab_size=len(tokenizer),
        train_text=texts["train"],
        test_text=texts["test"],
        ground_truth=flags_of(tables["train"], settings.ground_truth_column, origin),
    )
