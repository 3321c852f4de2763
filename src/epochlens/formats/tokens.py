"""Tokenising a text data set's splits with the user's tokenizer (its local ``save_pretrained``
files; nothing is downloaded): a classifier's texts, a causal LM's prompt and target, a
text-to-text model's input and target, padded to one length on the tokenizer's side
(:func:`tokenize_splits`, the settings of :class:`epochlens.formats.text.TextSettings`)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
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


#: Texts a classifier tokenises at a time: the tokenizer's Python lists of a chunk, never of a split.
TOKENIZE_ROWS = 16_384


def _pad(rows: Sequence[list[int]], length: int, value: int, left: bool) -> np.ndarray:
    out = np.full((len(rows), length), value, dtype=np.int64)
    for i, row in enumerate(rows):
        if left:
            out[i, length - len(row) :] = row
        else:
            out[i, : len(row)] = row
    return out


def _widen(array: np.ndarray, length: int, value: int, left: bool) -> np.ndarray:
    """``array`` (n, l) padded with ``value`` to (n, ``length``) on the left or the right."""
    pad = ((0, 0), (length - array.shape[1], 0) if left else (0, length - array.shape[1]))
    return np.pad(array, pad, constant_values=value)


def _text_chunks(tokenizer: Any, texts: Sequence, max_length: int, left: bool) -> list[dict[str, np.ndarray]]:
    """``input_ids`` and ``attention_mask`` of :data:`TOKENIZE_ROWS` texts at a time, each chunk
    padded on the left or the right to the chunk's longest (int64 arrays, filled in one step)."""
    chunks = []
    for lo in range(0, len(texts), TOKENIZE_ROWS):
        part = [str(t) for t in texts[lo : lo + TOKENIZE_ROWS]]
        ids = tokenizer(part, truncation=True, max_length=max_length, return_attention_mask=False,
                        return_token_type_ids=False)["input_ids"]  # fmt: skip
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        width = np.arange(lengths.max(initial=0))
        mask = width >= width.size - lengths[:, None] if left else width < lengths[:, None]
        rows = np.full(mask.shape, tokenizer.pad_token_id, np.int64)
        rows[mask] = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
        chunks.append({"input_ids": rows, "attention_mask": mask.astype(np.int64)})
    return chunks or [{k: np.zeros((0, 0), np.int64) for k in ("input_ids", "attention_mask")}]


def _classifier_tokens(tokenizer: Any, tables: Mapping[str, pd.DataFrame], settings: TextSettings) -> dict:
    """:func:`tokenize_splits` of a classifier's texts, a chunk at a time (:func:`_text_chunks`)."""
    left = getattr(tokenizer, "padding_side", "right") == "left"
    chunks = {s: _text_chunks(tokenizer, df[settings.text_column].to_numpy(), settings.max_length, left)
              for s, df in tables.items()}  # fmt: skip
    longest = max(c["input_ids"].shape[1] for parts in chunks.values() for c in parts)
    length = settings.max_length if settings.padding == "max_length" else longest
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0}
    return {
        split: {k: np.concatenate([_widen(c[k], length, v, left) for c in parts]) for k, v in pads.items()}
        for split, parts in chunks.items()
    }


def tokenize_splits(
    tokenizer: Any, tables: Mapping[str, pd.DataFrame], settings: TextSettings
) -> dict[str, dict[str, np.ndarray]]:
    """Per split: ``input_ids``, ``attention_mask`` (N, L) and, for a causal LM, token ``labels``
    (N, L) with :data:`IGNORE_INDEX` outside the target; both splits padded to one length L. A
    text-to-text model's ``labels`` are its targets' tokens (N, T), padded on the right with
    :data:`IGNORE_INDEX` to the longest target of both splits (:func:`_text_to_text`)."""
    if settings.kind == "text_to_text":
        return _text_to_text(tokenizer, tables, settings)
    if settings.kind == "classification":
        return _classifier_tokens(tokenizer, tables, settings)
    left = getattr(tokenizer, "padding_side", "right") == "left"
    encoded = {split: _prompt_target(tokenizer, df, settings, split) for split, df in tables.items()}
    longest = max(len(r) for ids, _ in encoded.values() for r in ids)
    length = settings.max_length if settings.padding == "max_length" else longest
    out = {}
    for split, (ids, labels) in encoded.items():
        out[split] = {
            "input_ids": _pad(ids, length, tokenizer.pad_token_id, left),
            "attention_mask": _pad([[1] * len(r) for r in ids], length, 0, left),
            "labels": _pad(labels, length, IGNORE_INDEX, left),
        }
    return out


def _text_to_text(
    tokenizer: Any, tables: Mapping[str, pd.DataFrame], settings: TextSettings
) -> dict[str, dict[str, np.ndarray]]:
    """Encoder inputs (the prompts, truncated to ``max_length``) and decoder labels (the targets,
    each ending with the tokenizer's eos token, never truncated) of every split."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(
            "a text-to-text model's targets end with the tokenizer's eos token, and this tokenizer has "
            "none; save it with an eos_token (T5's is </s>)."
        )
    prompts, targets = {}, {}
    for split, df in tables.items():
        prompts[split] = tokenizer(
            [str(p) for p in df[settings.prompt_column]], truncation=True, max_length=settings.max_length
        )["input_ids"]
        encoded = tokenizer(text_target=[str(t) for t in df[settings.target_column]])["input_ids"]
        targets[split] = [row if row and row[-1] == eos else [*row, eos] for row in encoded]
        for row, target in enumerate(targets[split]):
            if len(target) > settings.max_length:
                raise DataError(
                    f"{settings.split_names[split]} row {row}: the target has {len(target)} tokens (with "
                    f"eos), max_length is {settings.max_length}; raise data.text.max_length."
                )
    longest = max(len(r) for ids in prompts.values() for r in ids)
    length = settings.max_length if settings.padding == "max_length" else longest
    width = max(len(r) for rows in targets.values() for r in rows)
    left = getattr(tokenizer, "padding_side", "right") == "left"
    return {
        split: {
            "input_ids": _pad(prompts[split], length, tokenizer.pad_token_id, left),
            "attention_mask": _pad([[1] * len(r) for r in prompts[split]], length, 0, left),
            "labels": _pad(targets[split], width, IGNORE_INDEX, False),
        }
        for split in tables
    }


def _prompt_target(
    tokenizer: Any, df: pd.DataFrame, settings: TextSettings, split: str
) -> tuple[list[list[int]], list[list[int]]]:
    prompts = tokenizer([str(p) for p in df[settings.prompt_column]])["input_ids"]
    targets = tokenizer([str(t) for t in df[settings.target_column]], add_special_tokens=False)["input_ids"]
    ids, labels = [], []
    for row, (prompt, target) in enumerate(zip(prompts, targets, strict=True)):
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
