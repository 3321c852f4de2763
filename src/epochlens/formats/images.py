"""Image data in the layouts users have, read into :class:`epochlens.data.Dataset`.

* ``imagefolder``: torchvision's ImageFolder layout, one tree per split
  (:mod:`epochlens.formats.image_folder`).
* ``save_to_disk``: a Hugging Face ``datasets`` folder written by ``save_to_disk``: a ``DatasetDict``
  with the splits, or a single ``Dataset`` with a split column.
* ``parquet``: one file with a split column, a folder with one file (or shards) per split named
  after it (``train.parquet``, ``train-00000-of-00002.parquet``, also under ``data/``), or a mapping
  from split to file(s).

For the column formats, ``image_column`` holds encoded images (PNG/JPEG bytes; ``datasets.Image``
features, i.e. ``{bytes, path}``; file paths) or uint8 arrays (H, W), (H, W, C) or (C, H, W);
``label_column`` holds class ids (with ``ClassLabel`` names when ``datasets`` wrote them) or class
names (sorted, as for folders); the optional ``group_column`` is the cohort of each sample (e.g. the
source of the image), stored as :attr:`Dataset.train_groups` / ``test_groups`` with ``group_names``.

Every image is converted to ``channels`` (RGB or L) and resized to ``size`` with Pillow, so the
arrays (uint8, N x C x H x W) are what reaches the model and ``Dataset.content_hash`` covers them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epochlens.data import Dataset
from epochlens.data.blocks import Spill
from epochlens.errors import ConfigError, DataError
from epochlens.formats.image_decode import ImageSettings, RawSplit, assemble
from epochlens.formats.image_folder import load_image_folder

SPLITS = ("train", "test")
IMAGE_SOURCES = ("imagefolder", "save_to_disk", "parquet")


def load_images(
    kind: str, path: Any, settings: ImageSettings | None = None, spill: Spill | None = None
) -> Dataset:
    """Read image data of layout ``kind`` (one of :data:`IMAGE_SOURCES`) at ``path``; a large
    split's images decoded into ``spill`` (on disk), not memory."""
    loaders = {"imagefolder": load_image_folder, "save_to_disk": load_saved_dataset, "parquet": load_parquet}
    if kind not in loaders:
        raise ConfigError(f"unknown image data layout {kind!r}; use one of {list(IMAGE_SOURCES)}.")
    return loaders[kind](path, settings or ImageSettings(), spill)


# ---------------------------------------------------------------------------------------------
# Column formats (save_to_disk, parquet)


@dataclass
class _Table:
    """A pyarrow table read from ``origin`` with the ClassLabel names ``datasets`` stored for it."""

    table: Any  # pyarrow.Table
    origin: str
    label_names: dict[str, list[str]]  # column -> ClassLabel names
    base: Path | None = None

    def column(self, name: str, settings_key: str) -> list[Any]:
        if name not in self.table.column_names:
            raise DataError(
                f"{self.origin}: no column {name!r} (data.images.{settings_key}); the columns are "
                f"{self.table.column_names}. Set data.images.{settings_key} to one of them."
            )
        column = self.table.column(name)
        leaf, nested = column.type, False
        while True:
            leaf = getattr(leaf, "storage_type", leaf)  # datasets' ArrayND extension types
            if not hasattr(leaf, "value_type"):
                break
            leaf, nested = leaf.value_type, True
        if not nested or not (pa_types().is_integer(leaf) or pa_types().is_floating(leaf)):
            return column.to_pylist()
        dtype = leaf.to_pandas_dtype()  # nested lists: arrays of the stored dtype, not Python ints
        return [None if row is None else np.asarray(row, dtype=dtype) for row in column.to_pylist()]


def pa_types():
    import pyarrow.types

    return pyarrow.types


def _split_tables(tables: Mapping[str, _Table], settings: ImageSettings) -> dict[str, RawSplit]:
    splits = {}
    for split, t in tables.items():
        images = t.column(settings.image_column, "image_column")
        labels = t.column(settings.label_column, "label_column")
        groups = t.column(settings.group_column, "group_column") if settings.group_column else None
        where = [f"{t.origin} (row {i})" for i in range(len(images))]
        column = settings.ground_truth_column
        flags = t.column(column, "ground_truth_column") if column and split == "train" else None
        splits[split] = RawSplit(images, labels, groups, where, t.base, flags)
    return splits


def _by_split_column(table: _Table, settings: ImageSettings) -> dict[str, _Table]:
    """Rows of one table per split, by ``split_column``."""
    assert settings.split_column is not None
    values = np.asarray(table.column(settings.split_column, "split_column"), dtype=object)
    out = {}
    for split, name in settings.split_names.items():
        rows = np.flatnonzero(values == name)
        if len(rows) == 0:
            present = sorted({str(v) for v in values})[:10]
            raise DataError(
                f"{table.origin}: no rows with {settings.split_column} == {name!r} (values: {present}); "
                f"set data.images.{split}_split to the name of the {split} split."
            )
        out[split] = _Table(table.table.take(rows), table.origin, table.label_names, table.base)
    return out


def _common_names(tables: Iterable[_Table], column: str | None) -> list[str] | None:
    if column is None:
        return None
    names = [t.label_names.get(column) for t in tables]
    return names[0] if names and all(n is not None and n == names[0] for n in names) else None


def load_saved_dataset(
    path: str | Path, settings: ImageSettings | None = None, spill: Spill | None = None
) -> Dataset:
    """A ``datasets`` folder written by ``save_to_disk`` (DatasetDict, or Dataset + split column)."""
    settings = settings or ImageSettings()
    path = Path(path)
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DataError(
            f"{path}: reading a save_to_disk folder needs the 'datasets' package; install it."
        ) from exc
    if not path.is_dir():
        raise DataError(f"{path}: no such folder. Set data.path to the folder written by save_to_disk.")
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        found = sorted(p.name for p in path.iterdir())[:15]
        raise DataError(
            f"{path}: not a folder written by datasets' save_to_disk ({type(exc).__name__}: "
            f"{str(exc)[:200]}; found {found}). Expected dataset_dict.json with one folder per split, "
            "or dataset_info.json + state.json + data-*.arrow."
        ) from exc

    def table_of(ds: Any, origin: str) -> _Table:
        if getattr(ds, "_indices", None) is not None:
            ds = ds.flatten_indices()
        names = {c: f.names for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}
        return _Table(ds.data.table, origin, names, path)

    if isinstance(loaded, datasets.DatasetDict):
        missing = [n for n in settings.split_names.values() if n not in loaded]
        if missing and settings.split_column is None:
            raise DataError(
                f"{path}: no split(s) {missing} in the DatasetDict (splits: {list(loaded)}). Set "
                "data.images.train_split / data.images.test_split to the split names."
            )
        if settings.split_column is not None:
            if len(loaded) != 1:
                raise DataError(
                    f"{path}: data.images.split_column is set but the DatasetDict has the splits "
                    f"{list(loaded)}; "
                    "remove data.images.split_column to use them."
                )
            (only,) = loaded
            tables = _by_split_column(table_of(loaded[only], f"{path} [{only}]"), settings)
        else:
            tables = {s: table_of(loaded[n], f"{path} [{n}]") for s, n in settings.split_names.items()}
    else:
        if settings.split_column is None:
            raise DataError(
                f"{path}: a single Dataset (no splits, columns {loaded.column_names}); set "
                "data.images.split_column to the column that names each row's split, or save a "
                "DatasetDict with train and test."
            )
        tables = _by_split_column(table_of(loaded, str(path)), settings)
    return assemble(
        _split_tables(tables, settings),
        settings,
        settings.name or path.name,
        f"save_to_disk:{path}",
        class_names=_common_names(tables.values(), settings.label_column),
        group_names=_common_names(tables.values(), settings.group_column),
        spill=spill,
    )


def _read_parquet(files: Sequence[Path], origin: str) -> _Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for f in files:
        if not f.is_file():
            raise DataError(f"{f}: file not found. Fix data.path in the config.")
        try:
            parts.append(pq.read_table(f))
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{f}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:200]})."
            ) from exc
    try:
        table = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
    except pa.ArrowException as exc:
        raise DataError(f"{origin}: the parquet shards have different columns or types ({exc}).") from exc
    names: dict[str, list[str]] = {}
    meta = (parts[0].schema.metadata or {}).get(b"huggingface")
    if meta:
        try:
            features = json.loads(meta)["info"]["features"]
            names = {c: f["names"] for c, f in features.items() if f.get("_type") == "ClassLabel"}
        except (ValueError, KeyError, TypeError, AttributeError):
            names = {}
    return _Table(table, origin, names, files[0].parent)


def _split_files(folder: Path, split: str) -> list[Path]:
    """Parquet files of ``split`` in ``folder`` or ``folder/data``: ``split.parquet``, ``split-*.parquet``."""
    for where in (folder, folder / "data"):
        found = sorted(
            p
            for p in where.glob("*.parquet")
            if p.stem == split or p.name.startswith(f"{split}-") or p.name.startswith(f"{split}_")
        )
        if found:
            return found
    return []


def load_parquet(
    path: str | Path | Mapping[str, Any], settings: ImageSettings | None = None, spill: Spill | None = None
) -> Dataset:
    """Parquet image data: a file with a split column, a folder of per-split files, or
    ``{split name: file or [files]}``."""
    settings = settings or ImageSettings()
    if isinstance(path, Mapping):
        missing = [n for n in settings.split_names.values() if n not in path]
        if missing:
            raise ConfigError(f"data.path has no file(s) for split(s) {missing} (keys: {list(path)}).")
        tables = {}
        for split, name in settings.split_names.items():
            files = path[name] if isinstance(path[name], (list, tuple)) else [path[name]]
            files = [Path(f) for f in files]
            tables[split] = _read_parquet(files, ", ".join(str(f) for f in files))
        label = f"parquet:{json.dumps({k: str(v) for k, v in path.items()}, sort_keys=True)}"
        default_name = Path(str(path[settings.train_split])).stem
    else:
        path = Path(path)
        label, default_name = f"parquet:{path}", path.stem
        if path.is_dir():
            tables = {}
            for split, name in settings.split_names.items():
                files = _split_files(path, name)
                if not files:
                    found = sorted(p.name for p in path.rglob("*.parquet"))[:15]
                    raise DataError(
                        f"{path}: no parquet file for the {name!r} split (expected {name}.parquet or "
                        f"{name}-*.parquet, also under data/; found {found}). Name the files after the "
                        "splits or give one file with data.images.split_column."
                    )
                tables[split] = _read_parquet(files, ", ".join(str(f) for f in files))
        elif path.is_file():
            if settings.split_column is None:
                raise DataError(
                    f"{path}: one parquet file needs data.images.split_column (the column naming each "
                    "row's split), "
                    "or give a folder or a mapping with a file per split."
                )
            tables = _by_split_column(_read_parquet([path], str(path)), settings)
        else:
            raise DataError(f"{path}: no such file or folder. Fix data.path in the config.")
    return assemble(
        _split_tables(tables, settings),
        settings,
        settings.name or default_name,
        label,
        class_names=_common_names(tables.values(), settings.label_column),
        group_names=_common_names(tables.values(), settings.group_column),
        spill=spill,
    )
