"""A text run's ``dataset.h5`` read by rows, never whole: what a text run's model jobs read
(:func:`epochlens.data.rows.open_any_dataset`), as :mod:`epochlens.data.rows` is for images.

* :func:`open_text_dataset`: the :class:`~epochlens.data.text.TextDataset` with its token ids and
  attention masks left in the file (:class:`~epochlens.data.rows.RowReader`) and the content hash
  ``prepare_data`` stored; labels, groups and the holdout in memory (a classifier's: 8 bytes a
  sample; a causal LM's token labels: as large as its ids), and the triggered test split (the
  test split's size).
* :func:`open_any_dataset`: a run's ``dataset.h5`` as a job opens it, text or images
  (:func:`epochlens.data.rows.open_dataset`).

``TextDataset.rows(split, indices)`` (:class:`~epochlens.data.rows.TokenRows`) reads token rows a
batch at a time where a stage would hold the whole split (evaluation, sample outputs, influence).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py

from epochlens.data.rows import CHUNK_CACHE_BYTES, RowReader, StoredDataset, open_dataset
from epochlens.data.text import TextDataset, is_text_dataset
from epochlens.errors import DataError


@dataclass
class StoredTextDataset(TextDataset):
    """A :class:`TextDataset` whose token ids and masks stay in its ``dataset.h5``, with the
    content hash ``prepare_data`` computed and stored."""

    stored_hash: str = ""
    stored_max_token_id: int | None = None  # prepare_data's (None: a file written without it)

    @property
    def content_hash(self) -> str:
        """The stored hash while the tokens are the file's (a copy with other tokens, e.g. the
        triggered test split, is hashed again)."""
        return self.stored_hash if self._stored() else super().content_hash

    def max_token_id(self) -> int:
        """The stored largest token id while the tokens are the file's (read by rows without it)."""
        stored = self._stored() and self.stored_max_token_id is not None
        return self.stored_max_token_id if stored else super().max_token_id()

    def _stored(self) -> bool:
        keys = ("input_ids", "attention_mask")
        return all(isinstance(getattr(self, f"{s}_{k}"), RowReader) for s in ("train", "test") for k in keys)


def open_text_dataset(path: str | Path) -> StoredTextDataset:
    """A ``text.h5`` written by :func:`~epochlens.data.text.write_text_dataset` without its raw
    texts, the token ids and masks read by rows when asked for (the file stays open while they are
    referenced); a corrupt file is an error that says to rerun prepare_data."""
    path = Path(path)
    try:
        f = h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
        if f.attrs.get("format") != "epochlens-text-1":
            raise KeyError("not a text data set (format attribute)")
        train, test, attrs = f["train"], f["test"], f.attrs
        arrays = {f"{split}_{key}": RowReader(f[split][key], path)
                  for split in ("train", "test") for key in ("input_ids", "attention_mask")}  # fmt: skip
        arrays |= {f"{split}_labels": f[split]["labels"][()] for split in ("train", "test")}
        trig = f["test_trigger"] if "test_trigger" in f else None
        return StoredTextDataset(
            name=str(attrs["name"]),
            source=str(attrs["source"]),
            kind=str(attrs["kind"]),  # type: ignore[arg-type]
            num_classes=int(attrs["num_classes"]),
            class_names=json.loads(attrs["class_names"]),
            holdout=train["holdout"][()],
            train_groups=train["groups"][()] if "groups" in train else None,
            test_groups=test["groups"][()] if "groups" in test else None,
            group_names=json.loads(attrs["group_names"]),
            tokenizer=str(attrs["tokenizer"]),
            pad_token_id=int(attrs["pad_token_id"]),
            vocab_size=int(attrs.get("vocab_size", 0)),
            ground_truth=train["ground_truth"][()] if "ground_truth" in train else None,
            trigger_input_ids=None if trig is None else trig["input_ids"][()],
            trigger_attention_mask=None if trig is None else trig["attention_mask"][()],
            stored_hash=str(attrs["content_hash"]),
            stored_max_token_id=int(attrs["max_token_id"]) if "max_token_id" in attrs else None,
            **arrays,
        )
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens text data set ({exc}). Delete it and rerun the "
            "prepare_data rule."
        ) from exc


def open_any_dataset(path: str | Path) -> StoredTextDataset | StoredDataset:
    """A run's ``dataset.h5`` as a job reads it, its inputs left in the file: a text run's
    :func:`open_text_dataset` (token ids, no raw texts), else
    :func:`~epochlens.data.rows.open_dataset` (images)."""
    return open_text_dataset(path) if is_text_dataset(path) else open_dataset(path)
