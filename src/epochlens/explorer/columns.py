"""The dossier's columns as the explorer page loads them (the column contract: the dossier's module doc).

Each column of ``dossier.parquet`` is one of
- a *scalar* the page can plot, filter, sort and colour by: a ``number`` (float32, NaN where null) or
  a ``category`` (codes into a list of names: strings of few values, booleans, the label, the index);
- a *series* across checkpoints (a list column aligned with ``epochs``): an (n, E) float32 matrix;
- a list of *neighbours* (influence proponents/opponents, a query's top training samples): the
  positions they name turned into row numbers of the dossier, with their scores, padded with -1/NaN;
- a *string* per row shown in the sample panel and the table (``id``, ``text``, ``image``, and any
  string of many distinct values).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochlens.errors import DataError

#: Columns that name a row: (index, role, position) is the dossier's key.
KEY = ("index", "role", "position")
#: Integer columns shown as categories rather than numbers.
CATEGORICAL_INTS = ("index", "label")
#: Always shown as text, never as a category.
STRINGS = ("id", "text", "image")
#: List columns that hold one sample's values, not a series (a multi-output regression's target):
#: shown as text in the sample panel and the table.
VALUE_LISTS = ("target",)
#: A string column of at most this many distinct values is a category.
MAX_CATEGORIES = 256
#: Neighbour lists: (pattern of the positions column, its scores column, the role the positions name).
NEIGHBOURS = (
    (re.compile(r"^proponents_(?P<m>.+)$"), "proponent_scores_{m}", "query"),
    (re.compile(r"^opponents_(?P<m>.+)$"), "opponent_scores_{m}", "query"),
    (re.compile(r"^top_train_(?!scores_)(?P<m>.+)$"), "top_train_scores_{m}", "train"),
    (re.compile(r"^bottom_train_(?!scores_)(?P<m>.+)$"), "bottom_train_scores_{m}", "train"),
)


@dataclass
class Scalar:
    name: str
    kind: str  # "number" | "category"
    values: np.ndarray  # float32 (number) or uint8/uint16 codes (category)
    categories: list[str] | None = None

    @property
    def null_code(self) -> int | None:
        return None if self.kind == "number" else int(np.iinfo(self.values.dtype).max)


@dataclass
class Neighbours:
    name: str
    scores: str
    role: str  # the role of the rows it names
    rows: np.ndarray  # (n, k) float32 row numbers, -1 = none
    values: np.ndarray  # (n, k) float32 scores, NaN = none


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def scalar(name: str, column: pa.ChunkedArray) -> Scalar | None:
    """A plottable column, or None for a string of many values (shown as text)."""
    t = column.type
    if pa.types.is_boolean(t):
        codes = pc.fill_null(pc.cast(column, pa.uint8()), 255).to_numpy()
        return Scalar(name, "category", codes.astype(np.uint8), ["false", "true"])
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        if name in STRINGS:
            return None
        return _category(name, column, limit=MAX_CATEGORIES)
    if pa.types.is_integer(t) and name in CATEGORICAL_INTS:
        return _category(name, column, limit=None)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        values = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
        return Scalar(name, "number", values.astype(np.float32))
    return None


def _category(name: str, column: pa.ChunkedArray, limit: int | None) -> Scalar | None:
    encoded = pc.dictionary_encode(column).combine_chunks()
    names = encoded.dictionary.to_pylist()
    if limit is not None and len(names) > limit:
        return None
    order = sorted(range(len(names)), key=lambda i: names[i])  # numbers sort as numbers
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    dtype = np.uint8 if len(names) < 255 else np.uint16
    null = np.iinfo(dtype).max
    idx = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    codes = np.where(idx < 0, null, rank[np.maximum(idx, 0)]).astype(dtype)
    return Scalar(name, "category", codes, [str(names[i]) for i in order])


def series(name: str, column: pa.ChunkedArray | pa.Array, n_epochs: int, first: int = 0) -> np.ndarray:
    """An (n, E) float32 matrix of a list column aligned with ``epochs`` (NaN: null or no value),
    its first value the dossier's row ``first``."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    if not np.isin(lengths, (0, n_epochs)).all():
        bad = int(np.flatnonzero(~np.isin(lengths, (0, n_epochs)))[0])
        raise DataError(
            f"dossier column {name!r}: row {first + bad} holds {lengths[bad]} values for {n_epochs} epochs; "
            "every series must be aligned with the column 'epochs' (rebuild the dossier)"
        )
    flat = pc.cast(array.flatten(), pa.float32()).to_numpy(zero_copy_only=False)
    out = np.full((len(array), n_epochs), np.nan, dtype=np.float32)
    out[lengths == n_epochs] = flat.reshape(-1, n_epochs)
    return out


def neighbour_columns(names: list[str]) -> list[tuple[str, str, str]]:
    """(positions column, scores column, role named) for each neighbour list the dossier has."""
    found = []
    for name in names:
        for pattern, scores, role in NEIGHBOURS:
            match = pattern.match(name)
            if match and scores.format(m=match["m"]) in names:
                found.append((name, scores.format(m=match["m"]), role))
    return found


def row_lookup(index: np.ndarray, role: np.ndarray, position: np.ndarray) -> dict:
    """(index, role) -> array from position to row number (-1 where there is none)."""
    lookup = {}
    for i in np.unique(index):  # a few (index, role) pairs, found without a Python object per row
        for r in np.unique(role[index == i]):
            rows = np.flatnonzero((index == i) & (role == r))
            lookup[(int(i), str(r))] = table = np.full(int(position[rows].max()) + 1, -1, dtype=np.int64)
            table[position[rows]] = rows
    return lookup


def neighbours(
    table: pa.Table, spec: tuple[str, str, str], lookup: dict, index: np.ndarray, k: int
) -> Neighbours:
    """A neighbour list of ``table``'s rows as row numbers of the dossier (the named role, of the
    row's own ``index``), ``k`` a row (the list's :func:`longest` over the dossier)."""
    name, scores_name, role = spec
    positions = table.column(name).combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(positions), 0).to_numpy(zero_copy_only=False)
    flat_pos = positions.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    flat_scores = table.column(scores_name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    slot = np.arange(len(flat_pos)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    targets = np.full(len(flat_pos), -1, dtype=np.int64)
    for idx in np.unique(index):
        table_of = lookup.get((int(idx), role))
        sel = index[row_of] == idx
        if table_of is None:
            continue
        pos = flat_pos[sel]
        inside = (pos >= 0) & (pos < len(table_of))
        targets[np.flatnonzero(sel)[inside]] = table_of[pos[inside]]
    rows = np.full((len(lengths), k), -1, dtype=np.float32)
    values = np.full((len(lengths), k), np.nan, dtype=np.float32)
    rows[row_of, slot] = targets
    values[row_of, slot] = flat_scores
    return Neighbours(name, scores_name, role, rows, values)


def text_values(column: pa.ChunkedArray | pa.Array) -> list:
    """A string column's values; a value list's (:data:`VALUE_LISTS`) as text, ``0.5, -1.25``."""
    values = column.to_pylist()
    if not is_list(column.type):
        return values
    return [None if v is None else ", ".join(f"{x:.6g}" for x in v) for v in values]
