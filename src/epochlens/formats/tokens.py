"""Tokenising a text data set's rows with the user's tokenizer (its local ``save_pretrained``
files; nothing is downloaded): a classifier's texts, a causal LM's prompt and target, a
text-to-text model's input and target, padded on the tokenizer's side to ``max_length``
(:func:`tokenize_rows`, the settings of :class:`epochlens.formats.text.TextSettings`), a chunk of
rows at a time; :mod:`epochlens.formats.token_store` keeps them and cuts them to one length."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from epochlens.data.text import IGNORE_INDEX
from epochlens.errors import DataError

if TYPE_CHECKING:
    from epochlens.formats.text_settings import TextSettings

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "vocab.txt",
    "merges.txt", "tokenizer.model", "spiece.model", "added_tokens.json",
)  # fmt: skip


def tokenizer_fingerprint(folder: str | Path) -> str:
    """``<folder name> sha256:<digest>`` of the tokenizer files in ``folder``."""
    folder = Path(folder)
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            h.update(name.encode())
            h.update((folder / name).read_bytes())
    return f"{folder.name} sha256:{h.hexdigest()}"


def load_tokenizer(folder: str | Path, pad_token: str | None = None) -> Any:
    """The tokenizer saved in ``folder`` (``AutoTokenizer``, local files only), with a pad token."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir() or not any((folder / n).is_file() for n in TOKENIZER_FILES):
        raise DataError(
            f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILES[:5])}, ...). Set data.text.tokenizer "
            "to a folder written by tokenizer.save_pretrained (or the model's checkpoint folder)."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{folder}: cannot load the tokenizer ({type(exc).__name__}: {str(exc)[:300]})."
        ) from exc
    if pad_token is not None:
        tokenizer.pad_token = pad_token
    if tokenizer.pad_token_id is None:
        raise DataError(
            f"{folder}: the tokenizer has no pad token; set data.text.pad_token (e.g. to its eos token "
            f"{tokenizer.eos_token!r})."
        )
    return tokenizer


#: Rows tokenised at a time: the tokenizer's Python lists of a chunk, never of a split.
TOKENIZE_ROWS = 16_384


def _pad(rows: Sequence[list[int]], length: int, value: int, left: bool) -> np.ndarray:
    out = np.full((len(rows), length), value, dtype=np.int64)
    for i, row in enumerate(rows):
        if left:
            out[i, length - len(row) :] = row
        else:
            out[i, : len(row)] = row
    return out


def tokenize_rows(tokenizer: Any, df: pd.DataFrame, settings: TextSettings, split: str, first: int) -> dict:
    """``input_ids``, ``attention_mask`` (n, ``max_length``) of ``df``'s rows (``first``: the first
    one's position in its split, for messages), padded on the tokenizer's side, and a causal LM's
    token ``labels`` (-100 outside the target) or a text-to-text model's target ``labels``
    (right-padded with -100): int64 arrays at the full width, cut to the data's by
    :class:`epochlens.formats.token_store.TokenStore`."""
    left, width = getattr(tokenizer, "padding_side", "right") == "left", settings.max_length
    if settings.kind == "classification":
        return _text_rows(tokenizer, df[settings.text_column].to_numpy(), width, left)
    if settings.kind == "causal_lm":
        ids, labels = _prompt_target(tokenizer, df, settings, split, first)
        label_left = left
    else:
        ids, labels = _encoder_decoder(tokenizer, df, settings, split, first)
        label_left = False
    return {
        "input_ids": _pad(ids, width, tokenizer.pad_token_id, left),
        "attention_mask": _pad([[1] * len(r) for r in ids], width, 0, left),
        "labels": _pad(labels, width, IGNORE_INDEX, label_left),
    }


def _text_rows(tokenizer: Any, texts: Sequence, width: int, left: bool) -> dict[str, np.ndarray]:
    """A classifier's ``input_ids`` and ``attention_mask`` of ``texts``, padded on the left or the
    right to ``width`` (int64 arrays, filled in one step)."""
    ids = tokenizer([str(t) for t in texts], truncation=True, max_length=width, return_attention_mask=False,
                    return_token_type_ids=False)["input_ids"]  # fmt: skip
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    columns = np.arange(width)
    mask = columns >= width - lengths[:, None] if left else columns < lengths[:, None]
    rows = np.full(mask.shape, tokenizer.pad_token_id, np.int64)
    rows[mask] = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    return {"input_ids": rows, "attention_mask": mask.astype(np.int64)}


def _encoder_decoder(
    tokenizer: Any, df: pd.DataFrame, settings: TextSettings, split: str, first: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Encoder inputs (the prompts, truncated to ``max_length``) and decoder labels (the targets,
    each ending with the tokenizer's eos token, never truncated) of ``df``'s rows."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(
            "a text-to-text model's targets end with the tokenizer's eos token, and this tokenizer has "
            "none; save it with an eos_token (T5's is </s>)."
        )
    prompts = tokenizer(
        [str(p) for p in df[settings.prompt_column]], truncation=True, max_length=settings.max_length
    )["input_ids"]
    encoded = tokenizer(text_target=[str(t) for t in df[settings.target_column]])["input_ids"]
    targets = [row if row and row[-1] == eos else [*row, eos] for row in encoded]
    for row, target in enumerate(targets, first):
        if len(target) > settings.max_length:
            raise DataError(
                f"{settings.split_names[split]} row {row}: the target has {len(target)} tokens (with "
                f"eos), max_length is {settings.max_length}; raise data.text.max_length."
            )
    return prompts, targets


def _prompt_target(
    tokenizer: Any, df: pd.DataFrame, settings: TextSettings, split: str, first: int
) -> tuple[list[list[int]], list[list[int]]]:
    prompts = tokenizer([str(p) for p in df[settings.prompt_column]])["input_ids"]
    targets = tokenizer([str(t) for t in df[settings.target_column]], add_special_tokens=False)["input_ids"]
    ids, labels = [], []
    for row, (prompt, target) in enumerate(zip(prompts, targets, strict=True), first):
        if not target:
            raise DataError(f"{settings.split_names[split]} row {row}: the target has no tokens.")
        if len(target) >= settings.max_length:
            raise DataError(
                f"{settings.split_names[split]} row {row}: the target alone has {len(target)} tokens, "
                f"max_length is {settings.max_length}; raise data.text.max_length."
            )
        prompt = (
            prompt[len(prompt) + len(target) - settings.max_length :]
            if len(prompt) + len(target) > settings.max_length
            else prompt
        )
        ids.append(prompt + target)
        labels.append([IGNORE_INDEX] * len(prompt) + target)
    return ids, labels
