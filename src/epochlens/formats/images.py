"""Image data in the layouts users have, read into :class:`epochlens.data.Dataset`.

* ``imagefolder``: torchvision's ImageFolder layout, one tree per split::

      root/train/<class name>/**/*.png|jpg|...    root/test/<class name>/...

  Classes are the sorted folder names of the train split (as torchvision sorts them); files are
  taken in torchvision's order (``os.walk`` sorted, then sorted file names). Read with Pillow.
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

import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from epochlens.data import Dataset, channel_stats
from epochlens.data.ground_truth import as_flags
from epochlens.errors import ConfigError, DataError

SPLITS = ("train", "test")
# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGE_SOURCES = ("imagefolder", "save_to_disk", "parquet")
_RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos")


@dataclass
class ImageSettings:
    """How image data is read and turned into model inputs (the ``data`` section of a config)."""

    image_column: str = field(default="image", metadata={"help": "column of the images (column formats)"})
    label_column: str = field(default="label", metadata={"help": "column of the class ids or names"})
    group_column: str | None = field(
        default=None, metadata={"help": "column of each sample's cohort (e.g. its source); None: no groups"}
    )
    ground_truth_column: str | None = field(
        default=None,
        metadata={"help": "boolean column: True for each poisoned training sample (column formats)"},
    )
    split_column: str | None = field(
        default=None,
        metadata={"help": "column naming each row's split, for one table holding both splits"},
    )
    train_split: str = field(default="train", metadata={"help": "name of the training split"})
    test_split: str = field(default="test", metadata={"help": "name of the test split"})
    size: int | tuple[int, int] | None = field(
        default=None,
        metadata={"help": "resize every image to size x size (or [height, width]); None: keep, all equal"},
    )
    channels: Literal["RGB", "L"] = field(default="RGB", metadata={"help": "RGB (3 channels) or L (grey)"})
    resample: Literal["nearest", "bilinear", "bicubic", "lanczos"] = field(
        default="bilinear", metadata={"help": "Pillow filter for resizing (torchvision's default: bilinear)"}
    )
    scale: float = field(default=1.0 / 255.0, metadata={"help": "pixel value -> [0, 1] factor"})
    mean: Sequence[float] | None = field(
        default=None, metadata={"help": "per-channel mean after scaling; None: from the training images"}
    )
    std: Sequence[float] | None = field(
        default=None, metadata={"help": "per-channel std after scaling; None: from the training images"}
    )
    array_layout: Literal["hwc", "chw"] = field(
        default="hwc", metadata={"help": "layout of 3-d image arrays in a column (not for encoded images)"}
    )
    name: str | None = field(default=None, metadata={"help": "data set name; None: the file or folder name"})

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.size, int):
            self.size = (self.size, self.size)
        elif self.size is not None:
            self.size = tuple(int(s) for s in self.size)
            if len(self.size) != 2:
                problems.append(f"size={list(self.size)} must be one number or [height, width]")
        if self.size is not None and min(self.size) < 1:
            problems.append(f"size={list(self.size)} must be positive")
        if self.channels not in ("RGB", "L"):
            problems.append(f"channels={self.channels!r} must be RGB or L")
        if self.resample not in _RESAMPLE:
            problems.append(f"resample={self.resample!r} must be one of {list(_RESAMPLE)}")
        if self.array_layout not in ("hwc", "chw"):
            problems.append(f"array_layout={self.array_layout!r} must be hwc or chw")
        n_channels = 3 if self.channels == "RGB" else 1
        for key in ("mean", "std"):
            value = getattr(self, key)
            if value is not None:
                value = tuple(float(v) for v in value)
                setattr(self, key, value)
                if len(value) != n_channels:
                    problems.append(
                        f"{key} has {len(value)} values for {n_channels} channel(s) ({self.channels})"
                    )
        if (self.mean is None) != (self.std is None):
            problems.append("mean and std must be given together (or both left out)")
        if self.std is not None and min(self.std) <= 0:
            problems.append("std values must be > 0")
        if self.train_split == self.test_split:
            problems.append(f"train_split and test_split are both {self.train_split!r}")
        if problems:
            raise ConfigError(
                "data settings: " + "; ".join(problems) + ". Fix the data section of the config."
            )

    @property
    def split_names(self) -> dict[str, str]:
        """epochlens split -> the split's name in the user's data."""
        return {"train": self.train_split, "test": self.test_split}


def load_images(
    kind: str, path: str | Path | Mapping[str, Any], settings: ImageSettings | None = None
) -> Dataset:
    """Read image data of layout ``kind`` (one of :data:`IMAGE_SOURCES`) at ``path``."""
    settings = settings or ImageSettings()
    if kind == "imagefolder":
        return load_image_folder(path, settings)  # type: ignore[arg-type]
    if kind == "save_to_disk":
        return load_saved_dataset(path, settings)  # type: ignore[arg-type]
    if kind == "parquet":
        return load_parquet(path, settings)
    raise ConfigError(f"unknown image data layout {kind!r}; use one of {list(IMAGE_SOURCES)}.")


# ---------------------------------------------------------------------------------------------
# Decoding and assembling


@dataclass
class _Split:
    """One split as read from the user's files, before decoding."""

    images: Sequence[Any]  # bytes, {bytes, path} dicts, paths, PIL images or arrays
    labels: Sequence[Any]  # ints or names
    groups: Sequence[Any] | None
    where: list[str]  # where each sample comes from, for errors (file, or file#row)
    base: Path | None = None  # folder that relative image paths are relative to
    flags: Sequence[Any] | None = None  # the ground-truth column's values (data.ground_truth)


def _decode(item: Any, settings: ImageSettings, where: str, base: Path | None) -> np.ndarray:
    """One image as uint8 (C, H, W), converted to ``settings.channels`` and resized to ``size``."""
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(item, dict):
            data, path = item.get("bytes"), item.get("path")
            item = data if data is not None else path
            if item is None:
                raise DataError(f"{where}: the image is empty (bytes and path are both null).")
        if isinstance(item, (str, os.PathLike)):
            p = Path(item)
            if not p.is_absolute() and base is not None:
                p = base / p
            image = Image.open(p)
        elif isinstance(item, (bytes, bytearray, memoryview)):
            image = Image.open(io.BytesIO(bytes(item)))
        elif isinstance(item, Image.Image):
            image = item
        else:
            image = _array_image(np.asarray(item), settings, where)
        with image:
            image = image.convert(settings.channels)
            if settings.size is not None and image.size != (settings.size[1], settings.size[0]):
                resample = getattr(Image.Resampling, settings.resample.upper())
                image = image.resize((settings.size[1], settings.size[0]), resample=resample)
            array = np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(
            f"{where}: cannot read the image ({type(exc).__name__}: {str(exc)[:200]}). Replace or remove "
            "the file (or row)."
        ) from exc
    return array[None] if array.ndim == 2 else np.transpose(array, (2, 0, 1))


def _array_image(array: np.ndarray, settings: ImageSettings, where: str):
    from PIL import Image

    if np.issubdtype(array.dtype, np.integer) and array.size and 0 <= array.min() and array.max() <= 255:
        array = array.astype(np.uint8)  # e.g. lists of Python ints, stored as int64
    if array.dtype != np.uint8:
        raise DataError(
            f"{where}: image arrays must hold integers 0..255, got {array.dtype}"
            f"{'' if not array.size else f' from {array.min()} to {array.max()}'}. Store images as "
            "uint8 arrays or encoded PNG/JPEG bytes."
        )
    if array.ndim == 3 and settings.array_layout == "chw":
        array = np.transpose(array, (1, 2, 0))
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 2:
        return Image.fromarray(array, mode="L")
    if array.ndim == 3 and array.shape[2] in (3, 4):
        return Image.fromarray(np.ascontiguousarray(array), mode="RGB" if array.shape[2] == 3 else "RGBA")
    raise DataError(
        f"{where}: image array of shape {array.shape} is not (H, W), (H, W, C) or, with "
        "data.images.array_layout: chw, (C, H, W) with C in 1, 3, 4."
    )


def _assemble(
    splits: Mapping[str, _Split],
    settings: ImageSettings,
    name: str,
    source: str,
    class_names: list[str] | None = None,
    group_names: list[str] | None = None,
) -> Dataset:
    """Decode, check shapes, map labels and groups to ids, and build the Dataset."""
    images: dict[str, np.ndarray] = {}
    first: tuple[tuple[int, ...], str] | None = None
    for split, data in splits.items():
        decoded = []
        for item, where in zip(data.images, data.where, strict=True):
            array = _decode(item, settings, where, data.base)
            if first is None:
                first = (array.shape, where)
            elif array.shape != first[0]:
                raise DataError(
                    f"{where}: image of size {array.shape[1:]} but {first[1]} has {first[0][1:]}. Set "
                    "data.images.size in the config to resize every image to one size."
                )
            decoded.append(array)
        if not decoded:
            raise DataError(f"{source}: the {settings.split_names[split]!r} split has no images.")
        images[split] = np.stack(decoded)
    labels, class_names = _encode(
        {s: d.labels for s, d in splits.items()}, class_names, "label", settings.label_column, source
    )
    groups: dict[str, np.ndarray] | None = None
    if settings.group_column is not None:
        raw = {s: d.groups for s, d in splits.items()}
        groups, group_names = _encode(raw, group_names, "group", settings.group_column, source)  # type: ignore[arg-type]
    if settings.mean is not None:
        mean, std = tuple(settings.mean), tuple(settings.std)  # type: ignore[arg-type]
    else:
        mean, std = channel_stats(images["train"], settings.scale)
    return Dataset(
        name=name,
        source=source,
        train_images=images["train"],
        train_labels=labels["train"],
        test_images=images["test"],
        test_labels=labels["test"],
        num_classes=len(class_names),
        scale=settings.scale,
        mean=mean,
        std=std,
        class_names=class_names,
        train_groups=None if groups is None else groups["train"],
        test_groups=None if groups is None else groups["test"],
        group_names=(group_names or []) if groups is not None else [],
        ground_truth=None
        if splits["train"].flags is None
        else as_flags(splits["train"].flags, str(settings.ground_truth_column), f"{source} [train]"),
    )


def _encode(
    values: Mapping[str, Sequence[Any] | None], names: list[str] | None, what: str, column: str, source: str
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Ids and names of label/group values: ids as they are (named by ``names`` or by number) or
    names sorted (as ImageFolder sorts class folders)."""
    flat = [v for vals in values.values() for v in (vals or [])]
    if any(v is None for v in flat):
        raise DataError(
            f"{source}: the {what} column {column!r} has empty (null) values; fill or drop those rows."
        )
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in flat):
        ids = {s: np.asarray(list(v or []), dtype=np.int64) for s, v in values.items()}
        top = max((int(a.max()) for a in ids.values() if len(a)), default=-1)
        if min((int(a.min()) for a in ids.values() if len(a)), default=0) < 0:
            raise DataError(
                f"{source}: negative {what} ids in column {column!r}; ids must be 0, 1, 2, ... (datasets "
                "marks unlabelled rows with -1, e.g. a hidden test split: use a labelled split as "
                "data.images.test_split)."
            )
        if names is None:
            names = [str(i) for i in range(top + 1)]
        elif top >= len(names):
            raise DataError(
                f"{source}: {what} id {top} in column {column!r} but only {len(names)} names {names[:10]}."
            )
        return ids, list(names)
    if all(isinstance(v, str) for v in flat):
        names = sorted(set(flat))
        index = {n: i for i, n in enumerate(names)}
        return {
            s: np.asarray([index[v] for v in (vals or [])], dtype=np.int64) for s, vals in values.items()
        }, names
    kinds = sorted({type(v).__name__ for v in flat})
    raise DataError(
        f"{source}: the {what} column {column!r} holds {kinds}; use integer ids or names (strings)."
    )


# ---------------------------------------------------------------------------------------------
# ImageFolder


def load_image_folder(root: str | Path, settings: ImageSettings | None = None) -> Dataset:
    """``root/{train,test}/<class>/**/<image>`` (split folder names from the settings)."""
    settings = settings or ImageSettings()
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder. Set data.path to the folder holding train/ and test/.")
    folders = {s: root / n for s, n in settings.split_names.items()}
    missing = [str(p.name) for p in folders.values() if not p.is_dir()]
    if missing:
        found = sorted(p.name for p in root.iterdir() if p.is_dir())[:15]
        raise DataError(
            f"{root}: no split folder(s) {missing} (found folders {found}). Expected the ImageFolder "
            f"layout {root}/{settings.train_split}/<class>/<image> and "
            f"{root}/{settings.test_split}/<class>/<image>; "
            "set data.images.train_split / data.images.test_split to the folder names."
        )
    classes = sorted(e.name for e in os.scandir(folders["train"]) if e.is_dir())
    if not classes:
        raise DataError(
            f"{folders['train']}: no class folders; put each class's images in a folder named after it."
        )
    splits = {}
    for split, folder in folders.items():
        split_classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
        extra = [c for c in split_classes if c not in classes]
        if extra:
            raise DataError(
                f"{folder}: class folders {extra} are not in {folders['train']}; every test class must "
                "have training images."
            )
        files, labels = [], []
        for cls in classes:
            if cls not in split_classes:
                continue
            found = [
                Path(r) / f
                for r, _, names in sorted(os.walk(folder / cls, followlinks=True))
                for f in sorted(names)
                if f.lower().endswith(IMG_EXTENSIONS)
            ]
            if split == "train" and not found:
                raise DataError(
                    f"{folder / cls}: no images (extensions {list(IMG_EXTENSIONS)}); add them or remove "
                    "the folder."
                )
            files += found
            labels += [cls] * len(found)
        splits[split] = _Split(files, labels, None, [str(f) for f in files])
    if settings.group_column is not None:
        raise ConfigError(
            f"data.images.group_column={settings.group_column!r}: an image folder has no columns; use a "
            "save_to_disk or parquet data set for groups, or remove data.group_column."
        )
    index = {c: i for i, c in enumerate(classes)}
    for split in splits.values():
        split.labels = [index[c] for c in split.labels]
    return _assemble(splits, settings, settings.name or root.name, f"imagefolder:{root}", class_names=classes)


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


def _split_tables(tables: Mapping[str, _Table], settings: ImageSettings) -> dict[str, _Split]:
    splits = {}
    for split, t in tables.items():
        images = t.column(settings.image_column, "image_column")
        labels = t.column(settings.label_column, "label_column")
        groups = t.column(settings.group_column, "group_column") if settings.group_column else None
        where = [f"{t.origin} (row {i})" for i in range(len(images))]
        column = settings.ground_truth_column
        flags = t.column(column, "ground_truth_column") if column and split == "train" else None
        splits[split] = _Split(images, labels, groups, where, t.base, flags)
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


def load_saved_dataset(path: str | Path, settings: ImageSettings | None = None) -> Dataset:
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
    return _assemble(
        _split_tables(tables, settings),
        settings,
        settings.name or path.name,
        f"save_to_disk:{path}",
        class_names=_common_names(tables.values(), settings.label_column),
        group_names=_common_names(tables.values(), settings.group_column),
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


def load_parquet(path: str | Path | Mapping[str, Any], settings: ImageSettings | None = None) -> Dataset:
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
    return _assemble(
        _split_tables(tables, settings),
        settings,
        settings.name or default_name,
        label,
        class_names=_common_names(tables.values(), settings.label_column),
        group_names=_common_names(tables.values(), settings.group_column),
    )
