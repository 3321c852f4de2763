"""Tables of samples in the layouts users have (``jsonl``, ``csv``, ``parquet``, ``save_to_disk``),
read into one DataFrame per split (:func:`read_tables`), and tabular data sets built from them
(:func:`load_table`: numeric input columns and float target columns or a label column).

Layouts (``source``): ``jsonl``, ``csv``, ``parquet`` (one file with a split column, or a folder
with ``train.<ext>`` and ``test.<ext>``, split names from the settings) and ``save_to_disk`` (a
``datasets`` DatasetDict, or one Dataset with a split column), read a chunk of rows at a time
(:mod:`epochlens.formats.table_chunks`): text data sets tokenise each chunk as it comes
(:mod:`epochlens.formats.text`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from epochlens.data.dataset import Dataset, check_targets
from epochlens.data.sources import normalisation
from epochlens.errors import ConfigError, DataError
from epochlens.formats.table_chunks import TABLE_SOURCES, TableLayout, table_chunks

__all__ = ["TABLE_SOURCES", "TableSettings", "flags_of", "load_table", "read_tables"]


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
    """``{"train": df, "test": df}`` with the settings' columns (:func:`table_chunks` joined), and
    the label names a ``ClassLabel`` column carries (None otherwise)."""
    chunks, names = table_chunks(source, path, settings)
    parts: dict[str, list[pd.DataFrame]] = {split: [] for split in settings.split_names}
    for split, df in chunks:
        parts[split].append(df)
    return {split: pd.concat(dfs, ignore_index=True) for split, dfs in parts.items()}, names
