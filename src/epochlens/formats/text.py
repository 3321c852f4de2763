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
from pathlib import Path
from typing import Any

import pandas as pd

from epochlens.data.text import TextDataset
from epochlens.formats.image_decode import encode_values
from epochlens.formats.tables import TABLE_SOURCES, flags_of, read_tables
from epochlens.formats.text_settings import TextSettings
from epochlens.formats.tokens import load_tokenizer, tokenize_splits, tokenizer_fingerprint

TEXT_SOURCES = TABLE_SOURCES


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
