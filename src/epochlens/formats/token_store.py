"""A text data set's token rows and raw texts as ``prepare_data`` builds them, a chunk of rows at a
time, on disk: :class:`TokenStore` tokenises each chunk at ``max_length`` width
(:func:`epochlens.formats.tokens.tokenize_rows`) into a scratch HDF5 file beside ``dataset.h5``
(:class:`epochlens.data.blocks.Spill`), and gives every split cut to one length at the end
(:class:`PaddedRows`: the longest sample of every split, or ``max_length``), which
:func:`epochlens.data.text.write_text_dataset` copies a block of rows at a time. A million
sentences take the scratch file's disk, not memory; the tokens are those of the whole data set
tokenised at once. :func:`tokenize_splits` does the same in memory (small tables: tests, a
trigger phrase's sentences).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import pandas as pd

from epochlens.data.rows import RowReader
from epochlens.data.text import IGNORE_INDEX
from epochlens.formats.tokens import TOKENIZE_ROWS, tokenize_rows

if TYPE_CHECKING:
    from epochlens.formats.text_settings import TextSettings

#: Bytes of a chunk of the scratch arrays (compressed with lzf: most of a row is padding).
SCRATCH_CHUNK_BYTES = 1 << 20


class TokenStore:
    """Splits' token rows and texts added a chunk of rows at a time (:meth:`add`), read cut to one
    length (:meth:`arrays`, :meth:`texts`). ``scratch``: the HDF5 group they go to, read by rows
    (None: a file in memory, read into arrays and lists)."""

    def __init__(self, tokenizer: Any, settings: TextSettings, scratch: h5py.Group | None = None):
        self.tokenizer, self.settings, self.in_memory = tokenizer, settings, scratch is None
        self.group = h5py.File(io.BytesIO(), "w") if scratch is None else scratch
        self.left = getattr(tokenizer, "padding_side", "right") == "left"
        self.longest = {"input": 0, "target": 0}  # real tokens of the longest input and target

    def add(self, split: str, df: pd.DataFrame) -> None:
        """Tokenise ``df``'s rows (the next ones of ``split``) and keep them with their texts."""
        for lo in range(0, max(len(df), 1), TOKENIZE_ROWS):
            part = df.iloc[lo : lo + TOKENIZE_ROWS]
            first = len(self.group[split]["text"]) if split in self.group else 0
            arrays = tokenize_rows(self.tokenizer, part, self.settings, split, first)
            self.longest["input"] = max(
                self.longest["input"], int(arrays["attention_mask"].sum(1).max(initial=0))
            )
            if self.settings.kind == "text_to_text":
                target = int((arrays["labels"] != IGNORE_INDEX).sum(1).max(initial=0))
                self.longest["target"] = max(self.longest["target"], target)
            for key, array in arrays.items():
                _append(self.group.require_group(split), key, array)
            _append(self.group[split], "text", np.array(self._texts(part), dtype=h5py.string_dtype()))

    def _texts(self, df: pd.DataFrame) -> list[str]:
        """The raw texts: a classifier's; a causal LM's or text-to-text model's prompt and target,
        space-joined."""
        s = self.settings
        if s.kind == "classification":
            return [str(t) for t in df[s.text_column]]
        return [f"{p} {t}" for p, t in zip(df[s.prompt_column], df[s.target_column], strict=True)]

    def arrays(self, split: str) -> dict[str, PaddedRows | np.ndarray]:
        """``split``'s arrays of :func:`tokenize_rows`, cut to the inputs' length (the longest
        input of every split added, or ``max_length`` with ``padding: max_length``) and a
        text-to-text model's labels to the longest target."""
        s = self.settings
        length = s.max_length if s.padding == "max_length" else self.longest["input"]
        out = {
            key: PaddedRows(self.group[split][key], length, self.left)
            for key in ("input_ids", "attention_mask")
        }
        if s.kind == "causal_lm":
            out["labels"] = PaddedRows(self.group[split]["labels"], length, self.left)
        elif s.kind == "text_to_text":
            out["labels"] = PaddedRows(self.group[split]["labels"], self.longest["target"], False)
        return {key: np.asarray(a) for key, a in out.items()} if self.in_memory else out

    def texts(self, split: str) -> StoredTexts | list[str]:
        texts = StoredTexts(self.group[split]["text"])
        return list(texts) if self.in_memory else texts


def _append(group: h5py.Group, key: str, rows: np.ndarray) -> None:
    """``rows`` after the rows of ``group[key]`` (created resizable, chunked, lzf-compressed)."""
    if key not in group:
        chunk = max(1, SCRATCH_CHUNK_BYTES // (rows.dtype.itemsize * max(1, int(np.prod(rows.shape[1:])))))
        group.create_dataset(key, (0, *rows.shape[1:]), rows.dtype, maxshape=(None, *rows.shape[1:]),
                             chunks=(chunk, *rows.shape[1:]), compression="lzf")  # fmt: skip
    array = group[key]
    array.resize(len(array) + len(rows), axis=0)
    array[len(array) - len(rows) :] = rows


class PaddedRows(RowReader):
    """Rows of a scratch token array (N, ``max_length``) cut to (N, ``width``): the first
    ``width`` columns, or with ``left`` padding the last; read by rows as a
    :class:`~epochlens.data.rows.RowReader` is."""

    def __init__(self, array: h5py.Dataset, width: int, left: bool):
        super().__init__(array, array.file.filename)
        self.file = array.file  # kept open while the rows are referenced
        self.whole = RowReader(array, array.file.filename)
        full = array.shape[1]
        self.columns = slice(full - width, full) if left else slice(0, width)
        self.shape = (array.shape[0], width)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            return self.array[key, self.columns]
        return self.whole[key][..., self.columns]


class StoredTexts:
    """The raw texts of a scratch file's split as a list reads them: ``len``, ``texts[lo:hi]``
    (a list), iteration (a block at a time)."""

    def __init__(self, array: h5py.Dataset):
        self.array = array.asstr()
        self.file = array.file

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, key):
        return self.array[key].tolist() if isinstance(key, slice) else self.array[key]

    def __iter__(self):
        for lo in range(0, len(self), TOKENIZE_ROWS):
            yield from self[lo : lo + TOKENIZE_ROWS]


def tokenize_splits(
    tokenizer: Any, tables: Mapping[str, pd.DataFrame], settings: TextSettings
) -> dict[str, dict[str, np.ndarray]]:
    """Per split: ``input_ids``, ``attention_mask`` (N, L) and, for a causal LM, token ``labels``
    (N, L) with -100 outside the target; every split padded to one length L. A text-to-text
    model's ``labels`` are its targets' tokens (N, T), padded on the right with -100 to the longest
    target of every split. In memory (:class:`TokenStore`'s scratch file is)."""
    store = TokenStore(tokenizer, settings)
    for split, df in tables.items():
        store.add(split, df)
    return {split: store.arrays(split) for split in tables}
