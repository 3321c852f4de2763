"""Where each thumbnail lies in its sheet: thumbnails are packed, in row-major order of their
positions, into PNG sheets of at most :data:`SHEET_PX` pixels a side, so that a run's file count
grows with N / (thumbnails per sheet), never with N (a CIFAR run: 1,024 images a sheet, 50,000
training images in 49 files). A thumbnail is named by its sheet and a W3C media fragment,
``thumbs/{split}_{sheet}.png#xywh={x},{y},{w},{h}``: the dossier's ``image`` column, which the
explorer crops from the sheet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

#: The dossier's ``image`` column: a thumbnail's sheet relative to the dossier's folder.
THUMBS = "thumbs"
#: A sheet's largest side in pixels.
SHEET_PX = 1024
#: A thumbnail's largest side in pixels: larger images are scaled down to it.
THUMB_PX = 64


@dataclass(frozen=True)
class SheetLayout:
    """Thumbnails of ``height`` x ``width`` pixels, ``columns`` x ``rows`` to a sheet."""

    height: int
    width: int

    @classmethod
    def for_images(cls, height: int, width: int) -> SheetLayout:
        """The thumbnails of ``height`` x ``width`` images: their own size, or scaled down to
        :data:`THUMB_PX` on the longer side (aspect kept)."""
        f = min(1.0, THUMB_PX / max(height, width))
        return cls(max(1, round(height * f)), max(1, round(width * f)))

    @classmethod
    def of(cls, dataset: str | Path) -> SheetLayout:
        """The layout of a ``dataset.h5``'s images (N, C, H, W)."""
        with h5py.File(dataset, "r") as f:
            return cls.for_images(*f["train/images"].shape[2:4])

    @property
    def columns(self) -> int:
        return max(1, SHEET_PX // self.width)

    @property
    def per_sheet(self) -> int:
        return self.columns * max(1, SHEET_PX // self.height)

    def sheet(self, split: str, index: int) -> str:
        """``thumbs/{split}_{index}.png``, relative to the dossier's folder."""
        return f"{THUMBS}/{split}_{int(index)}.png"

    def name(self, split: str, position: int) -> str:
        """The ``image`` of sample ``position`` of ``split`` (train, test or test_trigger)."""
        index, cell = divmod(int(position), self.per_sheet)
        row, column = divmod(cell, self.columns)
        box = f"{column * self.width},{row * self.height},{self.width},{self.height}"
        return f"{self.sheet(split, index)}#xywh={box}"

    def names(self, split: str, positions) -> list[str]:
        """:meth:`name` of each of ``positions``."""
        return [self.name(split, p) for p in positions]

    def sheet_size(self, count: int) -> tuple[int, int]:
        """(height, width) in pixels of a sheet holding ``count`` thumbnails."""
        rows = -(-count // self.columns)
        return rows * self.height, min(count, self.columns) * self.width


def pack_sheet(layout: SheetLayout, images: np.ndarray, pixels: Callable) -> np.ndarray:
    """A sheet (uint8, white where empty) of the thumbnails of ``images`` (N, C, H, W) in their
    order: ``pixels`` turns 1 MB of images at a time into uint8 pictures (N, H, W[, 3]), each
    scaled down to the layout's size when it is larger."""
    from PIL import Image

    h, w = layout.height, layout.width
    sheet = None
    step = max(1, (1 << 20) // (8 * int(np.prod(images.shape[1:]))))  # 1 MB of float64
    for lo in range(0, len(images), step):
        for i, picture in enumerate(pixels(images[lo : lo + step]), lo):
            if picture.shape[:2] != (h, w):
                picture = np.asarray(Image.fromarray(picture).resize((w, h), Image.Resampling.BOX))
            if sheet is None:  # (H, W) or (H, W, 3): as the pictures are
                sheet = np.full((*layout.sheet_size(len(images)), *picture.shape[2:]), 255, np.uint8)
            row, column = divmod(i, layout.columns)
            sheet[row * h : (row + 1) * h, column * w : (column + 1) * w] = picture
    return sheet
