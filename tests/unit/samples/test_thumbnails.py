"""Thumbnails packed into sheets: every sample's crop, named by the dossier's ``image`` column, is
the picture of its image; the files grow with N / (thumbnails per sheet); the job reads the data
set a block at a time (its memory does not grow with N); a corrupt data set is refused."""

from __future__ import annotations

import tracemalloc

import h5py
import numpy as np
import pytest
from PIL import Image

from epochlens.data import blocks, rows
from epochlens.data.dataset import Dataset, read_dataset, write_dataset
from epochlens.errors import DataError
from epochlens.samples.identity import identity_frame
from epochlens.samples.sheets import SHEET_PX, SheetLayout
from epochlens.samples.thumbnails import display_range, to_pixels, write_thumbnails
from epochlens.study.corruption import apply_trigger, trigger_value


def images_dataset(path, n_train, n_test, shape=(1, 8, 8), seed=0, groups=False):
    rng = np.random.default_rng(seed)
    data = Dataset(
        name="t", source="test",
        train_images=rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
        train_labels=rng.integers(0, 3, n_train),
        test_images=rng.integers(0, 256, (n_test, *shape), dtype=np.uint8),
        test_labels=rng.integers(0, 3, n_test), num_classes=3, scale=1 / 255, mean=(0.5,), std=(0.25,),
        train_groups=rng.integers(0, 2, n_train) if groups else None,
        test_groups=rng.integers(0, 2, n_test) if groups else None,
    )  # fmt: skip
    write_dataset(data, path)
    return data


def crop(folder, name):
    """The picture a page shows for ``image`` = ``thumbs/{sheet}.png#xywh=x,y,w,h``."""
    sheet, box = name.split("#xywh=")
    x, y, w, h = map(int, box.split(","))
    return np.asarray(Image.open(folder.parent / sheet))[y : y + h, x : x + w]


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_each_crop_is_its_images_picture_and_files_grow_with_sheets(tmp_path, shape):
    layout = SheetLayout.for_images(*shape[1:])
    n_train = layout.per_sheet * 2 + 5  # three training sheets, the last one row and a bit
    data = images_dataset(tmp_path / "dataset.h5", n_train, 7, shape)
    folder = tmp_path / "thumbs"
    trigger = {"kind": "trigger", "patch_size": 3, "corner": "top_left"}
    assert write_thumbnails(tmp_path / "dataset.h5", folder, trigger) == n_train + 7 + 7
    assert sorted(p.name for p in folder.iterdir()) == [
        "test_0.png", "test_trigger_0.png", "train_0.png", "train_1.png", "train_2.png"
    ]  # fmt: skip
    assert max(Image.open(p).size[0] for p in folder.iterdir()) <= SHEET_PX
    shown = display_range(0.0, 1.0)
    triggered = apply_trigger(data.test_images, 3, "top_left", trigger_value(data))
    for split, images, positions in (
        ("train", data.train_images, [0, 1, layout.per_sheet - 1, layout.per_sheet, n_train - 1]),
        ("test", data.test_images, range(7)),
        ("test_trigger", triggered, range(7)),
    ):
        frame = identity_frame(
            tmp_path / "dataset.h5", split.split("_")[0], np.asarray(positions), None, split
        )
        for p, name in zip(positions, frame["image"], strict=True):
            np.testing.assert_array_equal(
                crop(folder, name), to_pixels(images[p : p + 1], data.scale, shown)[0]
            )


def test_large_images_are_scaled_down_to_64_pixels(tmp_path):
    data = images_dataset(tmp_path / "dataset.h5", 3, 1, (3, 128, 96))
    assert SheetLayout.of(tmp_path / "dataset.h5") == SheetLayout(64, 48)
    write_thumbnails(tmp_path / "dataset.h5", tmp_path / "thumbs")
    name = SheetLayout(64, 48).name("train", 2)
    assert name == "thumbs/train_0.png#xywh=96,0,48,64"
    box = to_pixels(data.train_images[2:3], data.scale)[0].reshape(64, 2, 48, 2, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(crop(tmp_path / "thumbs", name), box, atol=1)  # a 2x2 box filter


def test_the_job_reads_a_block_at_a_time(tmp_path, monkeypatch):
    """A data set of 40 MB: the peak of what the job allocates stays below a quarter of it (it read
    the whole data set as float64 before: eight times it)."""
    images_dataset(tmp_path / "small.h5", 10, 1, (1, 32, 32))
    write_thumbnails(tmp_path / "small.h5", tmp_path / "small")  # what it imports: not measured
    images_dataset(tmp_path / "dataset.h5", 40_000, 100, (1, 32, 32))
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        write_thumbnails(tmp_path / "dataset.h5", tmp_path / "thumbs")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40_100 * 1024 / 4, f"{peak / 1e6:.1f} MB"


@pytest.mark.parametrize("groups", [False, True])
def test_the_streamed_hash_is_the_data_sets_and_a_corrupt_file_is_refused(tmp_path, monkeypatch, groups):
    data = images_dataset(tmp_path / "dataset.h5", 300, 20, groups=groups)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 1000)  # many blocks
    with rows.StoredImages(tmp_path / "dataset.h5") as stored:
        assert (
            stored.content_hash() == data.content_hash == read_dataset(tmp_path / "dataset.h5").content_hash
        )
    with h5py.File(tmp_path / "dataset.h5", "r+") as f:
        f["train/images"][299, 0, 0, 0] ^= 1
    with pytest.raises(DataError, match="dataset.h5: content hash mismatch"):
        write_thumbnails(tmp_path / "dataset.h5", tmp_path / "thumbs")
    (tmp_path / "broken.h5").write_bytes(b"not hdf5")
    with pytest.raises(
        DataError, match="broken.h5: not a complete epochlens dataset.h5.*rerun the prepare_data"
    ):
        rows.StoredImages(tmp_path / "broken.h5")
