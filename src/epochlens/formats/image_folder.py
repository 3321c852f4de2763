"""Image data in torchvision's ImageFolder layout, one tree per split, read into
:class:`epochlens.data.Dataset`::

    root/train/<class name>/**/*.png|jpg|...    root/test/<class name>/...

Classes are the sorted folder names of the train split (as torchvision sorts them); files are
taken in torchvision's order (``os.walk`` sorted, then sorted file names), read with Pillow. The
files are listed again for each pass instead of held, so a folder of a million images takes a
class folder's listing of memory (its images decoded: :func:`epochlens.formats.image_decode.assemble`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from epochlens.data import Dataset
from epochlens.data.blocks import Spill
from epochlens.errors import ConfigError, DataError
from epochlens.formats.image_decode import ImageSettings, RawSplit, assemble

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def load_image_folder(
    root: str | Path, settings: ImageSettings | None = None, spill: Spill | None = None
) -> Dataset:
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
        present = [(label, folder / cls) for label, cls in enumerate(classes) if cls in split_classes]
        counts = [sum(1 for _ in _images_in(path)) for _, path in present]  # listed, not kept
        empty = [path for (_, path), n in zip(present, counts, strict=True) if n == 0]
        if split == "train" and empty:
            raise DataError(
                f"{empty[0]}: no images (extensions {list(IMG_EXTENSIONS)}); add them or remove the folder."
            )
        files = _FolderFiles([path for _, path in present], sum(counts))
        labels = [label for (label, _), n in zip(present, counts, strict=True) for _ in range(n)]
        splits[split] = RawSplit(files, labels, None, files)  # where: the file itself
    if settings.group_column is not None:
        raise ConfigError(
            f"data.images.group_column={settings.group_column!r}: an image folder has no columns; use a "
            "save_to_disk or parquet data set for groups, or remove data.group_column."
        )
    name = settings.name or root.name
    return assemble(splits, settings, name, f"imagefolder:{root}", class_names=classes, spill=spill)


def _images_in(folder: Path) -> Iterator[str]:
    """The image files under a class folder, in torchvision's order (sorted, subfolders after)."""
    for root, _, names in sorted(os.walk(folder, followlinks=True)):
        yield from (os.path.join(root, f) for f in sorted(names) if f.lower().endswith(IMG_EXTENSIONS))


@dataclass
class _FolderFiles:
    """A split's image files, class folder after class folder, listed again at each pass instead
    of held (a million paths took 460 MB); ``len()``: their number, counted when first listed."""

    folders: list[Path]
    count: int

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        for folder in self.folders:
            yield from _images_in(folder)
