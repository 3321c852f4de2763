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
longest sample of both splits (``padding: longest``) or to ``max_length``; the tables read and
tokenised a chunk of rows at a time into a scratch file (:mod:`epochlens.formats.token_store`).
The tokenizer's files are fingerprinted into the data set's content hash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from epochlens.data.text import TextDataset
from epochlens.formats.table_chunks import TABLE_SOURCES, ColumnCodes, table_chunks
from epochlens.formats.tables import flags_of
from epochlens.formats.text_settings import TextSettings
from epochlens.formats.token_store import TokenStore
from epochlens.formats.tokens import load_tokenizer, tokenizer_fingerprint

if TYPE_CHECKING:
    import h5py

TEXT_SOURCES = TABLE_SOURCES


def load_text(
    source: str,
    path: str | Path,
    settings: TextSettings,
    tokenizer_folder: str | Path,
    scratch: h5py.Group | None = None,
) -> TextDataset:
    """Read, tokenise and assemble a text data set (classification, causal LM or text-to-text), a
    chunk of rows at a time, the tokens and texts kept in ``scratch`` (None: in memory)."""
    chunks, label_names = table_chunks(source, path, settings)
    name = settings.name or Path(path).stem
    return text_dataset(chunks, label_names, settings, tokenizer_folder, name, f"{source}:{path}", scratch)


def source_tokenizer(source: str, settings: TextSettings, folder: str | Path | None) -> Any:
    """The tokenizer that :func:`load_text` (``folder``) or :func:`load_polarity` (its own) used."""
    if source != "polarity":
        return load_tokenizer(folder, settings.pad_token)
    import tempfile

    from epochlens.data.polarity import write_polarity_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        return load_tokenizer(write_polarity_tokenizer(Path(tmp) / "polarity-tokenizer"), settings.pad_token)


def load_polarity(
    settings: TextSettings,
    train: int = 600,
    test: int = 200,
    seed: int = 0,
    scratch: h5py.Group | None = None,
) -> TextDataset:
    """The synthetic polarity data set (:mod:`epochlens.data.polarity`), tokenised by its own
    word-level tokenizer (written to a temporary folder: its fingerprint is the vocabulary's)."""
    import tempfile

    from epochlens.data.polarity import CLASS_NAMES, polarity_tables, write_polarity_tokenizer

    settings = dataclasses.replace(settings, text_column="text", label_column="label", group_column="group")
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_polarity_tokenizer(Path(tmp) / "polarity-tokenizer")  # a fixed name: hashed
        origin = f"polarity(train={train}, test={test}, seed={seed})"
        tables = polarity_tables(train, test, seed)
        return text_dataset(tables, list(CLASS_NAMES), settings, folder, "polarity", origin, scratch)


def text_dataset(
    chunks: Mapping[str, pd.DataFrame] | Iterable[tuple[str, pd.DataFrame]],
    label_names: list[str] | None,
    settings: TextSettings,
    tokenizer_folder: str | Path,
    name: str,
    origin: str,
    scratch: h5py.Group | None = None,
) -> TextDataset:
    """Tokenise ``(split, rows)`` chunks or ``{split: rows}`` (:class:`TokenStore`) and assemble the
    data set (``label_names``: the class names in id order, or None to sort the label column's names)."""
    tokenizer = load_tokenizer(tokenizer_folder, settings.pad_token)
    store, labels, groups, flags = TokenStore(tokenizer, settings, scratch), ColumnCodes(), ColumnCodes(), []
    for split, df in chunks.items() if isinstance(chunks, Mapping) else chunks:
        store.add(split, df)
        if settings.kind == "classification":
            labels.add(split, df[settings.label_column])
        if settings.group_column:
            groups.add(split, df[settings.group_column])
        if split == "train" and settings.ground_truth_column:
            flags.append(flags_of(df, settings.ground_truth_column, origin))
    tokens = {split: store.arrays(split) for split in ("train", "test")}
    class_names: list[str] = []
    if settings.kind == "classification":
        ids, class_names = labels.encode(label_names, "label", settings.label_column, origin)
    else:
        ids = {split: tokens[split]["labels"] for split in tokens}
    codes, group_names = (
        groups.encode(None, "group", settings.group_column, origin) if settings.group_column else ({}, [])
    )
    return TextDataset(
        name=settings.name or name,
        source=origin,
        kind=settings.kind,
        **{f"{s}_{k}": tokens[s][k] for s in tokens for k in ("input_ids", "attention_mask")},
        train_labels=ids["train"],
        test_labels=ids["test"],
        num_classes=len(class_names),
        class_names=class_names,
        train_groups=codes.get("train"),
        test_groups=codes.get("test"),
        group_names=group_names,
        tokenizer=tokenizer_fingerprint(tokenizer_folder),
        pad_token_id=int(tokenizer.pad_token_id),
        vocab_size=len(tokenizer),
        train_text=store.texts("train"),
        test_text=store.texts("test"),
        ground_truth=np.concatenate(flags) if flags else None,
    )
