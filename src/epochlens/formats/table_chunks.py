"""Tables of samples read a chunk of rows at a time (:func:`table_chunks`): a text run's
``prepare_data`` tokenises each chunk as it comes, so a million sentences are never in memory at
once; :func:`epochlens.formats.tables.read_tables` joins the chunks of a split.

Layouts (``source``): ``jsonl``, ``csv`` (pandas' readers by ``chunksize``), ``parquet`` (its
record batches) and ``save_to_disk`` (``Dataset.to_pandas`` in batches): one file with a split
column, or a folder with ``train.<ext>`` and ``test.<ext>``. Rows of a split come in the file's
order whatever the layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from epochlens.errors import ConfigError, DataError
from epochlens.formats.image_decode import encode_values

TABLE_SOURCES = ("jsonl", "csv", "parquet", "save_to_disk")
#: Rows read at a time (pandas' jsonl reader holds ~14x a file read whole: never the whole file).
JSON_LINES = 65_536
_EXTENSIONS = {"jsonl": (".jsonl", ".json"), "csv": (".csv",), "parquet": (".parquet",)}

Chunks = Iterator[tuple[str, pd.DataFrame]]


class TableLayout(Protocol):
    """What :func:`table_chunks` needs of a data section's settings."""

    section: str  # where the settings are in the config, for messages ("data.table")
    label_column: str | None
    split_column: str | None

    @property
    def split_names(self) -> dict[str, str]: ...

    def columns(self) -> list[str]: ...


def table_chunks(source: str, path: str | Path, settings: TableLayout) -> tuple[Chunks, list[str] | None]:
    """``(split, rows)`` chunks of both splits ("train", "test"), each with the settings' columns
    (checked as they come; a split without rows is an error at the end), and the label names a
    ``ClassLabel`` column carries (None otherwise)."""
    if source not in TABLE_SOURCES:
        raise ConfigError(f"data.source: {source!r} is not a table layout; use one of {list(TABLE_SOURCES)}.")
    path = Path(path)
    names = None
    if source == "save_to_disk":
        chunks, names = _saved_chunks(path, settings)
    elif path.is_file():
        chunks = _by_split_column(_file_chunks(source, path), settings, str(path))
    elif path.is_dir():
        files = {s: _split_file(path, n, source) for s, n in settings.split_names.items()}
        chunks = ((s, df) for s, file in files.items() for df in _file_chunks(source, file))
    else:
        raise DataError(f"{path}: no such file or folder. Set data.path to your {source} data.")
    return _checked(chunks, path, settings), names


def _checked(chunks: Chunks, path: Path, settings: TableLayout) -> Chunks:
    """``chunks`` as they come, each split's columns checked; an error for a split without rows."""
    truth = getattr(settings, "ground_truth_column", None)  # the training split's only
    rows = dict.fromkeys(settings.split_names, 0)
    for split, df in chunks:
        missing = [
            c for c in settings.columns() if c not in df.columns and not (split == "test" and c == truth)
        ]
        if missing:
            raise DataError(
                f"{path} [{settings.split_names[split]}]: no column(s) {missing} (columns: "
                f"{list(df.columns)[:20]}). Set {settings.section}'s column names to yours."
            )
        rows[split] += len(df)
        yield split, df
    for split, n in rows.items():
        if n == 0:
            raise DataError(f"{path}: the {settings.split_names[split]!r} split has no rows.")


def _file_chunks(source: str, path: Path) -> Iterator[pd.DataFrame]:
    """One file's rows, :data:`JSON_LINES` at a time (the csv's empty cells kept as empty strings)."""
    try:
        if source == "parquet":
            import pyarrow.parquet as pq

            yield from (b.to_pandas() for b in pq.ParquetFile(path).iter_batches(batch_size=JSON_LINES))
            return
        reader = (
            pd.read_json(path, lines=True, dtype=False, chunksize=JSON_LINES)
            if source == "jsonl"
            else pd.read_csv(path, keep_default_na=False, chunksize=JSON_LINES)
        )
        with reader as lines:
            yield from (df.reset_index(drop=True) for df in lines)
    except (ValueError, OSError) as exc:
        raise DataError(
            f"{path}: not a readable {source} file ({type(exc).__name__}: {str(exc)[:200]})."
        ) from exc


def _split_file(folder: Path, name: str, source: str) -> Path:
    for ext in _EXTENSIONS[source]:
        if (folder / f"{name}{ext}").is_file():
            return folder / f"{name}{ext}"
    found = sorted(p.name for p in folder.iterdir())[:15]
    raise DataError(
        f"{folder}: no {name}{_EXTENSIONS[source][0]} (found {found}). Name the files after the splits, "
        "set the train_split / test_split of the data's section, or give one file with its split_column."
    )


def _by_split_column(chunks: Iterator[pd.DataFrame], settings: TableLayout, origin: str) -> Chunks:
    column = settings.split_column
    if column is None:
        raise DataError(
            f"{origin}: one table for both splits; set {settings.section}.split_column to the column "
            "that names each row's split, or give a folder with one file per split."
        )
    for df in chunks:
        if column not in df.columns:
            raise DataError(f"{origin}: no split column {column!r} (columns: {list(df.columns)[:20]}).")
        for split, name in settings.split_names.items():
            if len(part := df[df[column] == name].reset_index(drop=True)):
                yield split, part


def _saved_chunks(path: Path, settings: TableLayout) -> tuple[Chunks, list[str] | None]:
    import datasets

    if not path.is_dir():
        raise DataError(f"{path}: no such folder. Set data.path to the folder written by save_to_disk.")
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise DataError(
            f"{path}: not a folder written by datasets' save_to_disk "
            f"({type(exc).__name__}: {str(exc)[:200]})."
        ) from exc
    parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"": loaded}
    first = next(iter(parts.values()))
    label = first.features.get(settings.label_column) if settings.label_column else None
    names = list(label.names) if isinstance(label, datasets.ClassLabel) else None
    if isinstance(loaded, datasets.DatasetDict) and settings.split_column is None:
        missing = [n for n in settings.split_names.values() if n not in loaded]
        if missing:
            raise DataError(
                f"{path}: no split(s) {missing} in the DatasetDict (splits: {list(loaded)}). Set "
                f"{settings.section}.train_split / test_split."
            )
        return ((s, df) for s, n in settings.split_names.items() for df in _batches(loaded[n])), names
    if len(parts) != 1:
        raise DataError(
            f"{path}: {settings.section}.split_column is set but the DatasetDict has splits {list(loaded)}."
        )
    return _by_split_column(_batches(first), settings, str(path)), names


def _batches(dataset) -> Iterator[pd.DataFrame]:
    """A ``datasets.Dataset``'s rows as DataFrames of :data:`JSON_LINES` rows (none for no rows)."""
    if len(dataset):
        yield from dataset.to_pandas(batch_size=JSON_LINES, batched=True)


class ColumnCodes:
    """A label or group column's values, a chunk at a time: codes of the chunk's distinct values
    (8 bytes a row, not a Python object), encoded as
    :func:`~epochlens.formats.image_decode.encode_values` encodes all values (:meth:`encode`)."""

    def __init__(self):
        self.parts: dict[str, list[tuple[np.ndarray, list]]] = {"train": [], "test": []}

    def add(self, split: str, values: pd.Series) -> None:
        codes = pd.factorize(values, use_na_sentinel=False)[0]
        first = np.unique(codes, return_index=True)[1]  # each distinct value as the column holds it
        self.parts[split].append((codes.astype(np.int64), values.iloc[first].tolist()))

    def encode(self, names: list[str] | None, what: str, column: str, origin: str):
        distinct = {split: [v for _, values in parts for v in values] for split, parts in self.parts.items()}
        ids, names = encode_values(distinct, names, what, column, origin)
        out = {}
        for split, parts in self.parts.items():
            at = np.cumsum([0] + [len(values) for _, values in parts])
            codes = [ids[split][lo:][c] for (c, _), lo in zip(parts, at, strict=False)]
            out[split] = np.concatenate(codes) if codes else np.zeros(0, np.int64)
        return out, names
