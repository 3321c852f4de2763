"""A thumbnail PNG of every training and test image of a run (``samples/thumbs/``), for the
explorer's sample panel: ``train_{position}.png``, ``test_{position}.png`` and, for a backdoor
run, ``test_trigger_{position}.png`` (the test image with the trigger patch, as the influence
queries have it). Images are shown as stored times the data set's scale, clipped to [0, 1], at
their own size (a page scales them up pixelated): one channel as dark ink on white (as the
figures draw them), three as RGB; arrays with values outside [0, 1] (a regression's matrices)
with the data set's own range as black to white. Vectors (H = W = 1) have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import h5py
import numpy as np

#: The dossier's ``image`` column: a thumbnail's path relative to the dossier's folder.
THUMBS = "thumbs"


def thumbnail_name(split: str, position: int) -> str:
    """``thumbs/{split}_{position}.png`` (split: train, test or test_trigger)."""
    return f"{THUMBS}/{split}_{int(position)}.png"


def has_images(dataset: str | Path) -> bool:
    """Whether the data set's samples are images (N, C, H, W) with H, W > 1."""
    with h5py.File(dataset, "r") as f:
        if "train/images" not in f:
            return False
        shape = f["train/images"].shape
    return len(shape) == 4 and shape[2] > 1 and shape[3] > 1


def display_range(images: np.ndarray, scale: float) -> tuple[float, float]:
    """The values shown as black and white: [0, 1] for images (stored values times the scale),
    the data set's own range for other arrays (a regression's matrices: negative values too)."""
    x = np.asarray(images, np.float64) * scale
    low, high = float(x.min(initial=0.0)), float(x.max(initial=1.0))
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
    """Write every image's thumbnail into ``folder`` (``samples/thumbs``, created; left empty for
    data that are not images); returns how many. ``trigger``: the run's ``data.corruption`` (kind
    trigger: the triggered test images too)."""
    from PIL import Image

    from epochlens.data.dataset import read_dataset
    from epochlens.study.corruption import apply_trigger, trigger_value

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not has_images(dataset):
        return 0
    data = read_dataset(dataset)
    splits = {"train": data.train_images, "test": data.test_images}
    if trigger is not None and trigger.get("kind") == "trigger":
        patch = int(trigger["patch_size"]), trigger["corner"], trigger_value(data)
        splits["test_trigger"] = apply_trigger(data.test_images, *patch)
    shown = display_range(np.concatenate([data.train_images, data.test_images]), data.scale)
    count = 0
    for split, images in splits.items():
        for position, pixels in enumerate(to_pixels(images, data.scale, shown)):
            Image.fromarray(pixels).save(folder / Path(thumbnail_name(split, position)).name)
            count += 1
    return count
