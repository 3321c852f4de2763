"""Tables of samples in the layouts users have (``jsonl``, ``csv``, ``parquet``, ``save_to_disk``),
read into one DataFrame per split (:func:`read_tables`), and tabular data sets built from them
(:func:`load_table`: numeric input columns and float target columns or a label column).

Layouts (``source``): ``jsonl``, ``csv``, ``parquet`` (one file with a split column, or a folder
with ``train.<ext>`` and ``test.<ext>``, split names from the settings) and ``save_to_disk`` (a
``datasets`` DatasetDict, or one Dataset with a split column). Text data sets read the same tables
(:mod:`epochlens.formats.text`) and tokenise them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from epochlens.data.dataset import Dataset, check_targets
from epochlens.data.sources import normalisation
from epochlens.errors import ConfigError, DataError

TABLE_SOURCES = ("jsonl", "csv", "parquet", "save_to_disk")
JSON_LINES = 65_536
_EXTENSIONS = {"jsonl": (".jsonl", ".json"), "csv": (".csv",), "parquet": (".parquet",)}


class TableLayout(Protocol):
    """What :func:`read_tables` needs of a data section's settings."""

    section: str  # where the settings are in the config, for messages ("data.table")
    label_column: str | None
    split_column: str | None

    @property
    def split_names(self) -> dict[str, str]: ...

    def columns(self) -> list[str]: ...


@dataclass
class TableSettings:
    """A tabular data set (the ``data.table`` section): which columns hold the inputs, and the
    targets (regression) or the class labels (classification)."""

    input_columns: list[str] = field(
        default_factory=list,
        metadata={"help": "numeric columns of the inputs (one value each), or one column of arrays"},
    )
    target_columns: list[str] | None = field(
        default=None, metadata={"help": "regression: columns of the float targets (or one column of arrays)"}
    )
    label_column: str | None = field(
        default=None, metadata={"help": "classification: column of class ids or names"}
    )
    group_column: str | None = field(default=None, metadata={"help": "column of each sample's group"})
    split_column: str | None = field(default=None, metadata={"help": "column naming each row's split"})
    train_split: str = field(default="train", metadata={"help": "name of the training split"})
    test_split: str = field(default="test", metadata={"help": "name of the test split"})
    ground_truth_column: str | None = field(
        default=None, metadata={"help": "boolean column: True for each poisoned training sample"}
    )
    section = "data.table"

    def __post_init__(self) -> None:
        problems = []
        if not self.input_columns:
            problems.append("input_columns: at least one column")
        if (self.target_columns is None) == (self.label_column is None):
            problems.append("target_columns (a regression) or label_column (a classifier): one of the two")
        if self.train_split == self.test_split:
            problems.append(f"train_split and test_split are both {self.train_split!r}")
        if problems:
            raise ConfigError("data.table: " + "; ".join(problems) + ". Fix the config.")

    @property
    def split_names(self) -> dict[str, str]:
        return {"train": self.train_split, "test": self.test_split}

    def columns(self) -> list[str]:
        cols = [*self.input_columns, *(self.target_columns or []), self.label_column, self.group_column]
        return [c for c in [*cols, self.ground_truth_column] if c]


def load_table(source: str, path: str | Path, settings: TableSettings, normalize: str = "auto") -> Dataset:
    """A tabular data set: inputs (N, D) float32 from D numeric columns (or (N, ...) from one column
    of arrays), and float targets (N,) / (N, D) (regression) or class ids (classification)."""
    from epochlens.formats.image_decode import encode_values

    tables, label_names = read_tables(source, path, settings)
    origin = str(path)
    inputs = {s: _stack(df, settings.input_columns, origin, "input") for s, df in tables.items()}
    if settings.target_columns:
        targets = {s: _stack(df, settings.target_columns, origin, "target") for s, df in tables.items()}
        targets = {s: t[:, 0] if t.ndim == 2 and t.shape[1] == 1 else t for s, t in targets.items()}
        train_y, test_y = check_targets(targets["train"], targets["test"], origin)
        class_names: list[str] = []
    else:
        ids, class_names = encode_values(
            {s: df[settings.label_column].tolist() for s, df in tables.items()},
            label_names, "label", settings.label_column, origin,
        )  # fmt: skip
        train_y, test_y = ids["train"], ids["test"]
    groups, group_names = {"train": None, "test": None}, []
    if settings.group_column:
        groups, group_names = encode_values(
            {s: df[settings.group_column].tolist() for s, df in tables.items()},
            None, "group", settings.group_column, origin,
        )  # fmt: skip
    if inputs["train"].shape[1:] != inputs["test"].shape[1:]:
        raise DataError(
            f"{origin}: train inputs {inputs['train'].shape[1:]} vs test {inputs['test'].shape[1:]}."
        )
    regression = settings.target_columns is not None
    mean, std = normalisation(inputs["train"], 1.0, normalize, regression)
    return Dataset(
        name=Path(path).stem,
        source=origin,
        train_images=inputs["train"],
        train_labels=train_y,
        test_images=inputs["test"],
        test_labels=test_y,
        num_classes=0 if regression else len(class_names),
        scale=1.0,
        mean=mean,
        std=std,
        class_names=class_names,
        train_groups=groups["train"],
        test_groups=groups["test"],
        group_names=group_names,
        kind="regression" if regression else "classification",
        ground_truth=flags_of(tables["train"], settings.ground_truth_column, origin),
    )


def flags_of(train: pd.DataFrame, column: str | None, origin: str) -> np.ndarray | None:
    """The training split's ground-truth flags from ``column`` (None without one)."""
    if column is None:
        return None
    from epochlens.data.ground_truth import as_flags

    return as_flags(train[column].to_numpy(), column, f"{origin} [train]")


def _stack(df: pd.DataFrame, columns: list[str], origin: str, what: str) -> np.ndarray:
    """(N, len(columns)) from numeric columns, or (N, ...) from one column of arrays; float32 for
    inputs, float64 targets kept as float64 (float32 columns stay float32)."""
    try:
        if len(columns) == 1 and len(df) and isinstance(df[columns[0]].iloc[0], (list, tuple, np.ndarray)):
            values = np.stack([np.asarray(v) for v in df[columns[0]]])
        else:
            values = df[columns].to_numpy()
            values = values.astype(np.result_type(*[df[c].dtype for c in columns]))
    except (ValueError, TypeError) as exc:
        raise DataError(
            f"{origin}: the {what} column(s) {columns} are not numbers of one shape per row ({exc})."
        ) from exc
    if not np.issubdtype(values.dtype, np.number) or np.issubdtype(values.dtype, np.complexfloating):
        raise DataError(
            f"{origin}: the {what} column(s) {columns} hold {values.dtype} values; they must be numbers."
        )
    if what == "input":
        values = values.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(1))
        if len(bad):
            raise DataError(f"{origin}: {len(bad)} row(s) with NaN or Inf inputs (rows {bad[:10].tolist()}).")
    return values


def read_tables(
    source: str, path: str | Path, settings: TableLayout
) -> tuple[dict[str, pd.DataFrame], list[str] | None]:
    """``{"train": df, "test": df}`` with the settings' columns, and the label names a
    ``ClassLabel`` column carries (None otherwise)."""
    if source not in TABLE_SOURCES:
        raise ConfigError(f"data.source: {source!r} is not a table layout; use one of {list(TABLE_SOURCES)}.")
    path = Path(path)
    names = None
    if source == "save_to_disk":
        tables, names = _read_saved(path, settings)
    elif path.is_file():
        tables = _by_split_column(_read_file(source, path), settings, str(path))
    elif path.is_dir():
        tables = {
            s: _read_file(source, _split_file(path, n, source)) for s, n in settings.split_names.items()
        }
    else:
        raise DataError(f"{path}: no such file or folder. Set data.path to your {source} data.")
    truth = getattr(settings, "ground_truth_column", None)  # the training split's only
    for split, df in tables.items():
        missing = [
            c for c in settings.columns() if c not in df.columns and not (split == "test" and c == truth)
        ]
        if missing:
            raise DataError(
                f"{path} [{settings.split_names[split]}]: no column(s) {missing} (columns: "
                f"{list(df.columns)[:20]}). Set {settings.section}'s column names to yours."
            )
        if df.empty:
            raise DataError(f"{path}: the {settings.split_names[split]!r} split has no rows.")
    return tables, names


def _read_file(source: str, path: Path) -> pd.DataFrame:
    """One file as a DataFrame (the csv's empty cells kept as empty strings, not NaN)."""
    try:
        if source == "jsonl":  # by chunks of lines: pandas' reader holds ~14x a file read whole
            with pd.read_json(path, lines=True, dtype=False, chunksize=JSON_LINES) as lines:
                return pd.concat(lines, ignore_index=True)
        if source == "csv":
            return pd.read_csv(path, keep_default_na=False)
        return pd.read_parquet(path)
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


def _by_split_column(df: pd.DataFrame, settings: TableLayout, origin: str) -> dict[str, pd.DataFrame]:
    column = settings.split_column
    if column is None:
        raise DataError(
            f"{origin}: one table for both splits; set {settings.section}.split_column to the column "
            "that names each row's split, or give a folder with one file per split."
        )
    if column not in df.columns:
        raise DataError(f"{origin}: no split column {column!r} (columns: {list(df.columns)[:20]}).")
    return {s: df[df[column] == n].reset_index(drop=True) for s, n in settings.split_names.items()}


def _read_saved(path: Path, settings: TableLayout) -> tuple[dict[str, pd.DataFrame], list[str] | None]:
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
        return {s: loaded[n].to_pandas() for s, n in settings.split_names.items()}, names
    if len(parts) != 1:
        raise DataError(
            f"{path}: {settings.section}.split_column is set but the DatasetDict has splits {list(loaded)}."
        )
    return _by_split_column(first.to_pandas(), settings, str(path)), names
