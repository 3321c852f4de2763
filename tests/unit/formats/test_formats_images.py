"""Image data: ImageFolder trees, save_to_disk folders and parquet files read into one Dataset."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from epochlens.data import Dataset, channel_stats
from epochlens.errors import ConfigError, DataError
from epochlens.formats.image_decode import ImageSettings
from epochlens.formats.images import load_image_folder, load_images, load_parquet, load_saved_dataset

CLASSES = ["ant", "bee", "cat"]  # already sorted: ClassLabel ids equal the folder order


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def samples(rng: np.random.Generator) -> dict[str, list[tuple[np.ndarray, int, str]]]:
    """(HWC uint8 6x5 image, class id, source) per sample, sorted by class as ImageFolder reads them."""
    out = {}
    for split, per_class in (("train", 4), ("test", 2)):
        rows = []
        for label in range(3):
            for i in range(per_class):
                rows.append((rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), label, ("web", "lab")[i % 2]))
        out[split] = rows
    return out


def write_folder(root: Path, samples: dict) -> Path:
    for split, rows in samples.items():
        for i, (image, label, _) in enumerate(rows):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:03d}.png").write_bytes(png(image))
    return root


def expected(samples: dict, split: str) -> np.ndarray:
    return np.stack([np.transpose(img, (2, 0, 1)) for img, _, _ in samples[split]])


def test_image_folder_reads_torchvision_layout(tmp_path: Path, samples: dict) -> None:
    root = write_folder(tmp_path / "imgs", samples)
    (root / "train" / "ant" / "notes.txt").write_text("not an image")
    nested = root / "train" / "bee" / "more"
    nested.mkdir()
    extra = np.zeros((6, 5, 3), np.uint8)
    (nested / "Z.PNG").write_bytes(png(extra))  # upper-case extension, in a subfolder: after the files
    data = load_image_folder(root)
    assert isinstance(data, Dataset) and data.name == "imgs" and data.source == f"imagefolder:{root}"
    assert data.class_names == CLASSES and data.num_classes == 3
    train = expected(samples, "train")
    want = np.concatenate([train[:8], extra.transpose(2, 0, 1)[None], train[8:]])
    assert data.train_images.dtype == np.uint8 and np.array_equal(data.train_images, want)
    assert data.train_labels.tolist() == [0] * 4 + [1] * 5 + [2] * 4
    assert np.array_equal(data.test_images, expected(samples, "test"))
    assert data.test_labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert data.scale == 1 / 255 and (data.mean, data.std) == channel_stats(want, 1 / 255)
    assert data.train_groups is None and data.groups("test") is None


def test_resize_channels_and_normalisation_from_settings(tmp_path: Path, samples: dict) -> None:
    root = write_folder(tmp_path / "imgs", samples)
    settings = ImageSettings(size=[3, 4], channels="L", mean=[0.5], std=[0.25], resample="bilinear")
    data = load_image_folder(root, settings)
    first = Image.fromarray(samples["train"][0][0]).convert("L").resize((4, 3), Image.Resampling.BILINEAR)
    assert data.train_images.shape == (12, 1, 3, 4)
    assert np.array_equal(data.train_images[0, 0], np.asarray(first))
    assert (data.mean, data.std) == ((0.5,), (0.25,))
    x = data.normalized("train", np.array([0]))
    assert np.allclose(x.numpy()[0, 0], (np.asarray(first) / 255 - 0.5) / 0.25, atol=1e-6)
    # the hash covers what reaches the model: another size, other pixels, another hash
    assert load_image_folder(root, ImageSettings(size=3)).content_hash != data.content_hash


def hf_rows(samples: dict, split: str) -> dict[str, list]:
    return {
        "image": [{"bytes": png(img), "path": None} for img, _, _ in samples[split]],
        "label": [label for _, label, _ in samples[split]],
        "source": [src for _, _, src in samples[split]],
        "array": [img for img, _, _ in samples[split]],
    }


def features():
    import datasets

    return datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=CLASSES),
            "source": datasets.Value("string"),
            "array": datasets.Array3D((6, 5, 3), "uint8"),
        }
    )


def test_save_to_disk_dict_and_single_dataset(tmp_path: Path, samples: dict) -> None:
    import datasets

    folder_data = load_image_folder(write_folder(tmp_path / "imgs", samples))
    dd = datasets.DatasetDict(
        {s: datasets.Dataset.from_dict(hf_rows(samples, s), features=features()) for s in ("train", "test")}
    )
    dd.save_to_disk(str(tmp_path / "hf"))
    data = load_saved_dataset(tmp_path / "hf", ImageSettings(group_column="source"))
    for attr in ("train_images", "train_labels", "test_images", "test_labels"):
        assert np.array_equal(getattr(data, attr), getattr(folder_data, attr)), attr
    assert data.class_names == CLASSES and data.mean == folder_data.mean
    assert data.group_names == ["lab", "web"]
    assert data.groups("train").tolist() == [1, 0, 1, 0] * 3 and data.groups("test").tolist() == [1, 0] * 3
    # groups are part of the content: same pixels and labels, another hash than without them
    assert data.content_hash != folder_data.content_hash
    arrays = load_saved_dataset(tmp_path / "hf", ImageSettings(image_column="array"))
    assert np.array_equal(arrays.train_images, folder_data.train_images)
    assert arrays.content_hash == folder_data.content_hash

    rows = {k: hf_rows(samples, "train")[k] + hf_rows(samples, "test")[k] for k in ("image", "label")}
    rows["part"] = ["fit"] * 12 + ["holdout"] * 6
    feats = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=CLASSES),
            "part": datasets.Value("string"),
        }
    )
    datasets.Dataset.from_dict(rows, features=feats).save_to_disk(str(tmp_path / "single"))
    settings = ImageSettings(split_column="part", train_split="fit", test_split="holdout")
    one = load_saved_dataset(tmp_path / "single", settings)
    assert one.content_hash == folder_data.content_hash and one.class_names == CLASSES

    with pytest.raises(DataError, match=r"single\b.*a single Dataset.*set data.images.split_column"):
        load_saved_dataset(tmp_path / "single")
    with pytest.raises(DataError, match=r"no split\(s\) \['validation'\].*splits: \['train', 'test'\]"):
        load_saved_dataset(tmp_path / "hf", ImageSettings(test_split="validation"))
    with pytest.raises(DataError, match=r"no rows with part == 'test' \(values: \['fit', 'holdout'\]\)"):
        load_saved_dataset(tmp_path / "single", ImageSettings(split_column="part", train_split="fit"))


def test_missing_column_names_file_and_columns(tmp_path: Path, samples: dict) -> None:
    import datasets

    dd = datasets.DatasetDict(
        {s: datasets.Dataset.from_dict(hf_rows(samples, s), features=features()) for s in ("train", "test")}
    )
    dd.save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(DataError) as info:
        load_saved_dataset(tmp_path / "hf", ImageSettings(label_column="fine_label"))
    msg = str(info.value)
    assert f"{tmp_path / 'hf'} [train]: no column 'fine_label' (data.images.label_column)" in msg
    assert "['image', 'label', 'source', 'array']" in msg and "Set data.images.label_column" in msg
    with pytest.raises(DataError, match=r"no column 'origin' \(data.images.group_column\)"):
        load_saved_dataset(tmp_path / "hf", ImageSettings(group_column="origin"))
    with pytest.raises(DataError, match=r"not a folder written by datasets' save_to_disk"):
        load_saved_dataset(tmp_path)


def test_parquet_layouts(tmp_path: Path, samples: dict) -> None:
    import datasets

    folder_data = load_image_folder(write_folder(tmp_path / "imgs", samples))

    def table(split: str, **extra) -> pa.Table:
        rows = {
            "img": [png(img) for img, _, _ in samples[split]],
            "cls": [CLASSES[label] for _, label, _ in samples[split]],  # names: sorted into ids
            "source": [src for _, _, src in samples[split]],
        }
        return pa.table({**rows, **extra})

    settings = ImageSettings(image_column="img", label_column="cls", group_column="source")
    folder = tmp_path / "pq"
    (folder / "data").mkdir(parents=True)
    train = table("train")
    pq.write_table(train.slice(0, 5), folder / "data" / "train-00000-of-00002.parquet")
    pq.write_table(train.slice(5), folder / "data" / "train-00001-of-00002.parquet")
    pq.write_table(table("test"), folder / "data" / "test-00000-of-00001.parquet")
    by_folder = load_parquet(folder, settings)
    assert by_folder.content_hash != folder_data.content_hash  # it has groups
    assert np.array_equal(by_folder.train_images, folder_data.train_images)
    assert (
        by_folder.class_names == CLASSES
        and by_folder.train_labels.tolist() == folder_data.train_labels.tolist()
    )
    assert by_folder.source == f"parquet:{folder}" and by_folder.group_names == ["lab", "web"]

    both = pa.concat_tables([table("train", s=["tr"] * 12), table("test", s=["te"] * 6)])
    pq.write_table(both, tmp_path / "all.parquet")
    one = load_images(
        "parquet",
        tmp_path / "all.parquet",
        ImageSettings(
            image_column="img",
            label_column="cls",
            group_column="source",
            split_column="s",
            train_split="tr",
            test_split="te",
        ),
    )
    assert one.content_hash == by_folder.content_hash
    mapping = {
        "train": str(folder / "data" / "train-00000-of-00002.parquet"),
        "test": folder / "data" / "test-00000-of-00001.parquet",
    }
    part = load_parquet(mapping, settings)
    assert len(part.train_labels) == 5

    # written by datasets: ClassLabel names come from the file's metadata; images as {bytes, path}
    for split in ("train", "test"):
        datasets.Dataset.from_dict(hf_rows(samples, split), features=features()).to_parquet(
            str(tmp_path / "hfpq" / f"{split}.parquet")
        )
    hf = load_parquet(tmp_path / "hfpq")
    assert hf.class_names == CLASSES and hf.content_hash == folder_data.content_hash

    with pytest.raises(
        DataError,
        match=r"all.parquet: no column 'image' \(data.images.image_column\); the columns are "
        r"\['img', 'cls', 'source', 's'\]",
    ):
        load_parquet(
            tmp_path / "all.parquet", ImageSettings(split_column="s", train_split="tr", test_split="te")
        )
    with pytest.raises(DataError, match=r"all.parquet: one parquet file needs data.images.split_column"):
        load_parquet(tmp_path / "all.parquet")
    with pytest.raises(
        DataError, match=r"no parquet file for the 'validation' split.*train-00000-of-00002.parquet"
    ):
        load_parquet(folder, ImageSettings(test_split="validation"))


def test_bad_images_and_settings(tmp_path: Path, samples: dict) -> None:
    root = write_folder(tmp_path / "imgs", samples)
    odd = root / "train" / "cat" / "999.png"
    odd.write_bytes(png(np.zeros((7, 7, 3), np.uint8)))
    with pytest.raises(
        DataError, match=r"999.png: image of size \(7, 7\) but .*000.png has \(6, 5\).*data.images.size"
    ):
        load_image_folder(root)
    assert load_image_folder(root, ImageSettings(size=4)).train_images.shape == (13, 3, 4, 4)
    odd.write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"999.png: cannot read the image.*Replace or remove"):
        load_image_folder(root, ImageSettings(size=4))
    odd.unlink()
    (root / "test" / "dog").mkdir()
    with pytest.raises(DataError, match=r"test: class folders \['dog'\] are not in .*train"):
        load_image_folder(root)
    (root / "test" / "dog").rmdir()
    with pytest.raises(
        DataError, match=r"imgs: no split folder\(s\) \['val'\] \(found folders \['test', 'train'\]\)"
    ):
        load_image_folder(root, ImageSettings(test_split="val"))
    with pytest.raises(ConfigError, match=r"image folder has no columns"):
        load_image_folder(root, ImageSettings(group_column="source"))
    with pytest.raises(
        ConfigError, match=r"mean has 1 values for 3 channel\(s\).*mean and std must be given"
    ):
        ImageSettings(mean=[0.5])
    with pytest.raises(ConfigError, match=r"size=\[1, 2, 3\].*channels='RGBA'"):
        ImageSettings(size=[1, 2, 3], channels="RGBA")
    with pytest.raises(ConfigError, match=r"unknown image data layout 'tfrecord'"):
        load_images("tfrecord", root)


def test_array_columns_and_string_labels(tmp_path: Path, rng: np.random.Generator) -> None:
    grey = rng.integers(0, 256, (4, 3, 3), dtype=np.uint8)
    chw = rng.integers(0, 256, (4, 3, 3, 3), dtype=np.uint8)
    for name, images, layout, channels in (("grey", grey, "hwc", "L"), ("chw", chw, "chw", "RGB")):
        t = pa.table(
            {"x": [a.tolist() for a in images], "y": ["b", "a", "b", "a"], "s": ["tr", "tr", "te", "te"]}
        )
        pq.write_table(t, tmp_path / f"{name}.parquet")
        settings = ImageSettings(
            image_column="x",
            label_column="y",
            split_column="s",
            train_split="tr",
            test_split="te",
            array_layout=layout,
            channels=channels,
        )
        data = load_parquet(tmp_path / f"{name}.parquet", settings)
        want = images[:, None] if name == "grey" else images
        assert np.array_equal(np.concatenate([data.train_images, data.test_images]), want)
        assert data.class_names == ["a", "b"] and data.train_labels.tolist() == [1, 0]
    floats = pa.table({"x": [np.zeros((2, 2)).tolist()] * 2, "y": [0, 1], "s": ["tr", "te"]})
    pq.write_table(floats, tmp_path / "f.parquet")
    with pytest.raises(
        DataError, match=r"f.parquet \(row 0\): image arrays must hold integers 0..255, got float64"
    ):
        load_parquet(
            tmp_path / "f.parquet",
            ImageSettings(
                image_column="x", label_column="y", split_column="s", train_split="tr", test_split="te"
            ),
        )


def test_dataset_without_groups_keeps_its_hash(tiny_dataset: Dataset) -> None:
    h = hashlib.sha256()
    for arr in (
        tiny_dataset.train_images,
        tiny_dataset.train_labels,
        tiny_dataset.test_images,
        tiny_dataset.test_labels,
    ):
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    assert tiny_dataset.content_hash == h.hexdigest()
    with pytest.raises(ValueError, match="both be given"):
        Dataset(**{**tiny_dataset.__dict__, "train_groups": np.zeros(12, int)})
    grouped = Dataset(
        **{**tiny_dataset.__dict__, "train_groups": np.zeros(12, int), "test_groups": np.ones(6, int)}
    )
    assert grouped.group_names == ["0", "1"] and grouped.content_hash != tiny_dataset.content_hash


def test_unlabelled_rows_are_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    img = rng.integers(0, 256, (2, 2), dtype=np.uint8).tolist()
    pq.write_table(
        pa.table({"image": [img] * 3, "label": [0, 1, -1], "s": ["a", "a", "b"]}), tmp_path / "u.parquet"
    )
    settings = ImageSettings(split_column="s", train_split="a", test_split="b", channels="L")
    with pytest.raises(DataError, match=r"negative label ids in column 'label'.*unlabelled rows with -1"):
        load_parquet(tmp_path / "u.parquet", settings)


def test_a_large_split_is_decoded_to_disk_and_written_the_same(
    tmp_path: Path, samples: dict, monkeypatch
) -> None:
    """Above WHOLE_VALUES a split's decoded images go to a scratch file beside dataset.h5 (a block
    of rows at a time), not memory: the data set written is the one decoded in memory (images,
    labels, hash; the statistics to rounding), a trigger can still be planted, and the scratch
    file is gone once the data set is written."""
    import h5py

    from epochlens.data import blocks, stats, write_dataset
    from epochlens.data.blocks import Spill
    from epochlens.study.corruption import corrupt

    root = write_folder(tmp_path / "imgs", samples)
    monkeypatch.setattr(stats, "WHOLE_VALUES", 100)  # 12 train images of 90 values: above it
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 5 * 90)  # blocks of 5 rows: 5, 5, 2
    in_memory = load_image_folder(root)
    write_dataset(in_memory, tmp_path / "memory.h5")
    out = tmp_path / "spilled" / "dataset.h5"
    with Spill(out) as spill:
        data = load_image_folder(root, spill=spill)
        assert isinstance(data.train_images, h5py.Dataset) and spill.path.is_file()
        assert data.content_hash == in_memory.content_hash
        np.testing.assert_allclose(data.mean + data.std, in_memory.mean + in_memory.std, rtol=1e-13)
        write_dataset(data, out)
        poisoned, idx = corrupt(data, {"kind": "trigger", "fraction": 0.5, "target_class": 0, "seed": 0,
                                       "patch_size": 2, "corner": "bottom_right"})  # fmt: skip
        assert len(idx) and poisoned.train_images[idx[0], :, -1, -1].max() == 255
    assert not spill.path.exists() and sorted(p.name for p in out.parent.iterdir()) == ["dataset.h5"]
    with h5py.File(out) as a, h5py.File(tmp_path / "memory.h5") as b:
        for key in ("train/images", "train/labels", "test/images", "test/labels"):
            np.testing.assert_array_equal(a[key][()], b[key][()])
        assert a.attrs["content_hash"] == b.attrs["content_hash"]
