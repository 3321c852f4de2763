"""A text run's ``dataset.h5`` read: by rows, never whole, as a text run's model jobs read it
(as :mod:`epochlens.data.rows` reads images), whole (training, retraining) or its strings.

* :func:`open_text_dataset`: the :class:`~epochlens.data.text.TextDataset` with its token ids and
  attention masks left in the file (:class:`~epochlens.data.rows.RowReader`) and the content hash
  ``prepare_data`` stored; labels, groups and the holdout in memory (a classifier's: 8 bytes a
  sample; a causal LM's token labels: as large as its ids), and the triggered test split (the
  test split's size).
* :func:`open_any_dataset`: a run's ``dataset.h5`` as a job opens it, text or images
  (:func:`epochlens.data.rows.open_dataset`); :func:`read_any_dataset` read whole.
* :func:`read_text_dataset`: the whole file, its hash checked; :func:`stored_strings`: the raw
  texts of some rows (tables and figures).

``TextDataset.rows(split, indices)`` (:class:`~epochlens.data.text.TokenRows`) reads token rows a
batch at a time where a stage would hold the whole split (evaluation, sample outputs, influence).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

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
        top = int(f.attrs["max_token_id"]) if "max_token_id" in f.attrs else None
        fields = _fields(f, lambda array: RowReader(array, path))
        return StoredTextDataset(**fields, stored_hash=str(f.attrs["content_hash"]), stored_max_token_id=top)
    except (OSError, KeyError, ValueError) as exc:
        raise _incomplete(path, exc) from exc


def _fields(f: h5py.File, tokens) -> dict:
    """A :class:`TextDataset`'s fields from an open ``text.h5`` but the raw texts: the splits' ids,
    masks and token labels (N, L) as ``tokens(array)`` gives them, everything else read whole."""
    if f.attrs.get("format") != "epochlens-text-1":
        raise KeyError("not a text data set (format attribute)")
    train, test, attrs = f["train"], f["test"], f.attrs
    trig = f["test_trigger"] if "test_trigger" in f else None
    labels = {f"{s}_labels": f[s]["labels"] for s in ("train", "test")}  # class ids, or token labels
    return dict(
        {f"{s}_{k}": tokens(f[s][k]) for s in ("train", "test") for k in ("input_ids", "attention_mask")},
        **{key: tokens(y) if y.ndim == 2 else y[()] for key, y in labels.items()},
        name=str(attrs["name"]),
        source=str(attrs["source"]),
        kind=str(attrs["kind"]),
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
    )


def _incomplete(path: Path, exc: Exception) -> DataError:
    what = f"{path}: not a complete epochlens text data set ({exc})."
    return DataError(f"{what} Delete it and rerun the prepare_data rule.")


def open_any_dataset(path: str | Path) -> StoredTextDataset | StoredDataset:
    """A run's ``dataset.h5`` as a job reads it, its inputs left in the file: a text run's
    :func:`open_text_dataset` (token ids, no raw texts), else
    :func:`~epochlens.data.rows.open_dataset` (images)."""
    return open_text_dataset(path) if is_text_dataset(path) else open_dataset(path)


#: The raw texts' groups in ``text.h5`` and their :class:`TextDataset` fields.
TEXTS = {"train": "train_text", "test": "test_text", "test_trigger": "trigger_text"}


def read_text_dataset(path: str | Path, texts: bool = True) -> TextDataset:
    """Read a ``text.h5`` written by :func:`write_text_dataset` (``texts=False``: without the raw
    texts, which no model job reads); a corrupt file is an error that says to rerun prepare_data."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            fields = _fields(f, lambda array: array[()])
            strings = {field: _strings(f[group], "text") for group, field in TEXTS.items() if group in f}
            ds = TextDataset(**fields, **(strings if texts else {}))
            stored = str(f.attrs["content_hash"])
    except (OSError, KeyError, ValueError) as exc:
        raise _incomplete(path, exc) from exc
    if ds.content_hash != stored:
        raise DataError(
            f"{path}: content hash mismatch; the file is corrupt. Delete it and rerun prepare_data."
        )
    return ds


def _strings(group: h5py.Group, key: str) -> list[str] | None:
    return _decoded(group[key][()]) if key in group else None


def _decoded(values) -> list[str]:
    return [s.decode() if isinstance(s, bytes) else str(s) for s in values]


def stored_strings(path: str | Path, key: str, positions: np.ndarray | None = None) -> list[str] | None:
    """The strings of ``key``: all, or those at ``positions`` (the rows from the first to the last,
    or, for a few rows spread far apart such as the top-ranked samples, those rows alone)."""
    try:
        with h5py.File(path, "r") as f:
            if key not in f:
                return None
            values = f[key][()] if positions is None else _strings_at(f[key], np.asarray(positions, np.int64))
            return _decoded(values)
    except OSError as exc:
        raise DataError(f"{path}: unreadable ({exc}). Delete it and rerun the prepare_data rule.") from exc


#: Rows between the first and the last asked for that are read in one range all the same.
SPREAD_ROWS = 4096


def _strings_at(array: h5py.Dataset, positions: np.ndarray) -> np.ndarray:
    """``array[positions]``: the rows between the first and the last, or the rows alone (h5py
    reads an increasing list of rows) where they are few and far apart."""
    if len(positions) == 0:
        return np.zeros(0, object)
    rows, back = np.unique(positions, return_inverse=True)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    spread = hi - lo > 4 * len(rows) + SPREAD_ROWS
    return (array[rows.tolist()] if spread else array[lo:hi][rows - lo])[back]


def read_any_dataset(path: str | Path):
    """A run's ``dataset.h5``: a :class:`TextDataset` for a text run, else the image
    :class:`epochlens.data.Dataset`."""
    from epochlens.data import read_dataset

    return read_text_dataset(path) if is_text_dataset(path) else read_dataset(path)
