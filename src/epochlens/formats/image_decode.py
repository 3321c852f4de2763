"""How images become the model's arrays (:class:`ImageSettings`: channels, size, resampling, the
columns and splits to read) and how the splits read from the user's files, before decoding
(:class:`RawSplit`), are decoded with Pillow and assembled into one :class:`epochlens.data.Dataset`
(:func:`assemble`; labels and groups as ids and names: :func:`encode_values`). The layouts they are
read from: :mod:`epochlens.formats.images`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from epochlens.data import Dataset, stats
from epochlens.data.blocks import Spill, SpilledRows
from epochlens.data.ground_truth import as_flags
from epochlens.data.stats import batch_like, channel_stats
from epochlens.errors import ConfigError, DataError

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
        problems = self._size_problems()
        if self.channels not in ("RGB", "L"):
            problems.append(f"channels={self.channels!r} must be RGB or L")
        if self.resample not in _RESAMPLE:
            problems.append(f"resample={self.resample!r} must be one of {list(_RESAMPLE)}")
        if self.array_layout not in ("hwc", "chw"):
            problems.append(f"array_layout={self.array_layout!r} must be hwc or chw")
        problems += self._normalisation_problems()
        if self.train_split == self.test_split:
            problems.append(f"train_split and test_split are both {self.train_split!r}")
        if problems:
            raise ConfigError(
                "data settings: " + "; ".join(problems) + ". Fix the data section of the config."
            )

    def _size_problems(self) -> list[str]:
        """``size`` as (height, width): what is wrong with it."""
        problems = []
        if isinstance(self.size, int):
            self.size = (self.size, self.size)
        elif self.size is not None:
            self.size = tuple(int(s) for s in self.size)
            if len(self.size) != 2:
                problems.append(f"size={list(self.size)} must be one number or [height, width]")
        if self.size is not None and min(self.size) < 1:
            problems.append(f"size={list(self.size)} must be positive")
        return problems

    def _normalisation_problems(self) -> list[str]:
        """``mean`` and ``std`` as tuples of floats: what is wrong with them."""
        problems = []
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
        return problems

    @property
    def split_names(self) -> dict[str, str]:
        """epochlens split -> the split's name in the user's data."""
        return {"train": self.train_split, "test": self.test_split}


@dataclass
class RawSplit:
    """One split as read from the user's files, before decoding."""

    images: Sequence[Any]  # bytes, {bytes, path} dicts, paths, PIL images or arrays
    labels: Sequence[Any]  # ints or names
    groups: Sequence[Any] | None
    where: Sequence[str]  # where each sample comes from, for errors (file, or file#row)
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
            image = Image.open(Path(item) if base is None or Path(item).is_absolute() else base / item)
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


def assemble(
    splits: Mapping[str, RawSplit],
    settings: ImageSettings,
    name: str,
    source: str,
    class_names: list[str] | None = None,
    group_names: list[str] | None = None,
    spill: Spill | None = None,
) -> Dataset:
    """Decode, check shapes, map labels and groups to ids, and build the Dataset; a split of more
    than :data:`~epochlens.data.stats.WHOLE_VALUES` values decoded into ``spill`` (on disk)."""
    images: dict[str, np.ndarray] = {}
    first: tuple[tuple[int, ...], str] | None = None
    for split, data in splits.items():
        decoded: np.ndarray | None = None  # filled in place: the split's images held once
        pairs = (
            ((i, i) for i in data.images)
            if data.where is data.images
            else zip(data.images, data.where, strict=True)
        )
        for row, (item, where) in enumerate(pairs):  # where: the item itself for a folder's files
            array = _decode(item, settings, where, data.base)
            if first is None:
                first = (array.shape, where)
            elif array.shape != first[0]:
                raise DataError(
                    f"{where}: image of size {array.shape[1:]} but {first[1]} has {first[0][1:]}. Set "
                    "data.images.size in the config to resize every image to one size."
                )
            if decoded is None:
                large = spill is not None and len(data.images) * array.size > stats.WHOLE_VALUES
                decoded = (
                    spill.rows(len(data.images), array) if large else batch_like(len(data.images), array)
                )
            decoded[row] = array  # uint8 (C, H, W), every image of one shape
        if decoded is None:
            raise DataError(f"{source}: the {settings.split_names[split]!r} split has no images.")
        images[split] = decoded.finish() if isinstance(decoded, SpilledRows) else decoded
    labels, class_names = encode_values(
        {s: d.labels for s, d in splits.items()}, class_names, "label", settings.label_column, source
    )
    groups: dict[str, np.ndarray] | None = None
    if settings.group_column is not None:
        raw = {s: d.groups for s, d in splits.items()}
        groups, group_names = encode_values(raw, group_names, "group", settings.group_column, source)  # type: ignore[arg-type]
    given = (tuple(settings.mean), tuple(settings.std)) if settings.mean is not None else None  # type: ignore[arg-type]
    mean, std = given or channel_stats(images["train"], settings.scale)
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


def encode_values(
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
