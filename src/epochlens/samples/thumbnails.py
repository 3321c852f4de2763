"""A thumbnail of every training and test image of a run, packed into PNG sheets under
``samples/thumbs/`` (:mod:`epochlens.samples.sheets`: where each lies), for the explorer's sample
panel: the training images, the test images and, for a backdoor run, the test images with the
trigger patch (as the influence queries have them). Images are shown as stored times the data
set's scale, clipped to [0, 1], at their own size up to 64 pixels a side (a page scales them up
pixelated): one channel as dark ink on white (as the figures draw them), three as RGB; arrays with
values outside [0, 1] (a regression's matrices) with the data set's own range as black to white.
Vectors (H = W = 1) have none. The data set is read a sheet at a time: memory stays flat in N.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import h5py
import numpy as np

from epochlens.samples.sheets import SheetLayout, pack_sheet


def has_images(dataset: str | Path) -> bool:
    """Whether the data set's samples are images (N, C, H, W) with H, W > 1."""
    with h5py.File(dataset, "r") as f:
        if "train/images" not in f:
            return False
        shape = f["train/images"].shape
    return len(shape) == 4 and shape[2] > 1 and shape[3] > 1


def display_range(low: float, high: float) -> tuple[float, float]:
    """The values shown as black and white, of images whose values (stored times the scale) lie in
    [low, high]: [0, 1] for images, the data's own range for other arrays (negative values too)."""
    low, high = min(0.0, low), max(1.0, high)
    return (0.0, 1.0) if low >= 0.0 and high <= 1.0 else (low, high)


def to_pixels(images: np.ndarray, scale: float, value_range: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """uint8 pictures (N, H, W) or (N, H, W, 3) of stored images (N, C, H, W), ``value_range``
    (after the scale) mapped to [0, 1]."""
    low, high = value_range
    x = np.clip((np.asarray(images, np.float64) * scale - low) / max(high - low, 1e-12), 0.0, 1.0)
    if x.shape[1] == 1:
        return np.round(255 * (1.0 - x[:, 0])).astype(np.uint8)  # ink on paper, as gray_r
    return np.round(255 * np.transpose(x[:, :3], (0, 2, 3, 1))).astype(np.uint8)


def write_thumbnails(dataset: str | Path, folder: str | Path, trigger: Mapping | None = None) -> int:
    """Write the thumbnail sheets of every image into ``folder`` (``samples/thumbs``, created; left
    empty for data that are not images); returns how many thumbnails. ``trigger``: the run's
    ``data.corruption`` (kind trigger: the triggered test images too)."""
    from PIL import Image

    from epochlens.data.rows import StoredImages
    from epochlens.study.corruption import apply_trigger, trigger_value

    Path(folder).mkdir(parents=True, exist_ok=True)
    if not has_images(dataset):
        return 0
    count = 0
    with StoredImages(dataset) as data:
        shown = display_range(*data.verify())
        layout = SheetLayout.for_images(*data.train_images.shape[2:4])
        splits = {"train": data.train_images, "test": data.test_images}
        if trigger is not None and trigger.get("kind") == "trigger":
            patch = int(trigger["patch_size"]), trigger["corner"], trigger_value(data)
            splits["test_trigger"] = data.test_images
        for split, images in splits.items():
            for index, lo in enumerate(range(0, len(images), layout.per_sheet)):
                block = images[lo : lo + layout.per_sheet]
                block = apply_trigger(block, *patch) if split == "test_trigger" else block
                sheet = pack_sheet(layout, block, lambda x: to_pixels(x, data.scale, shown))
                Image.fromarray(sheet).save(Path(folder) / Path(layout.sheet(split, index)).name)
                count += len(block)
    return count
