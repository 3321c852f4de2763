"""Data sources (CIFAR-100 pickles, npz, digits), the holdout split and the dataset.h5 contract."""

from __future__ import annotations

import dataclasses
import io
import pickle
import struct

import h5py
import numpy as np
import pytest
import torch

from epochlens.data import (
    CIFAR100_MEAN,
    CIFAR100_STD,
    Dataset,
    channel_stats,
    holdout_mask,
    load_cifar100,
    load_digits,
    load_npz,
    load_source,
    read_dataset,
    write_dataset,
)
from epochlens.errors import DataError

# ---------------------------------------------------------------- CIFAR-100 in its real layout


class _Py2Pickler(pickle._Pickler):
    """Writes pickles the way Python 2's cPickle wrote ``cifar-100-python``.

    Python 2 ``str`` (keys, names, numpy's raw buffer) is pickled as (SHORT_)BINSTRING and numpy
    lives in ``numpy.core.multiarray``. Python 3 can only read such files with ``encoding="latin1"``
    (keys come back as ``str``, and numpy decodes the buffer), which is why the loader uses it.
    """

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else bytes(obj)
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = _save_py2_str
    dispatch[bytes] = _save_py2_str

    def save_global(self, obj, name=None):
        module = obj.__module__
        if module.startswith("numpy._core"):
            module = module.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode())
        self.memoize(obj)


def _py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _py3_pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


FINE_NAMES = [f"fine{c:02d}" for c in range(100)]
COARSE_NAMES = [f"coarse{c:02d}" for c in range(20)]


def _cifar_split(rng, n: int, label_offset: int) -> dict:
    fine = [(label_offset + 37 * i) % 100 for i in range(n)]
    return {
        "filenames": [f"img_{label_offset}_{i}.png" for i in range(n)],
        "batch_label": "training batch 1 of 1",
        "fine_labels": fine,
        "coarse_labels": [f // 5 for f in fine],
        "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
    }


def write_cifar100(folder, rng, dumps=_py2_pickle, n_train: int = 6, n_test: int = 4) -> dict:
    """Write a small ``cifar-100-python`` folder; returns the dicts that were pickled."""
    folder.mkdir(parents=True, exist_ok=True)
    content = {
        "train": _cifar_split(rng, n_train, 3),
        "test": _cifar_split(rng, n_test, 11),
        "meta": {"fine_label_names": FINE_NAMES, "coarse_label_names": COARSE_NAMES},
    }
    for name, obj in content.items():
        (folder / name).write_bytes(dumps(obj))
    return content


@pytest.fixture
def cifar_dir(tmp_path, rng):
    folder = tmp_path / "cifar-100-python"
    return folder, write_cifar100(folder, rng)


def test_py2_pickle_helper_writes_the_original_encoding(cifar_dir):
    folder, _ = cifar_dir
    raw = (folder / "train").read_bytes()
    assert raw.startswith(b"\x80\x02}")  # protocol 2, a dict
    assert b"U\x04data" in raw and b"U\x0bfine_labels" in raw  # py2 str keys
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in raw
    with pytest.raises(UnicodeDecodeError):  # the raw buffer is not ASCII: latin1 is needed
        pickle.loads(raw)


@pytest.mark.parametrize("dumps", [_py2_pickle, _py3_pickle], ids=["py2-cPickle", "py3-protocol2"])
def test_load_cifar100_reads_the_pickle_layout(tmp_path, rng, dumps):
    folder = tmp_path / "cifar-100-python"
    content = write_cifar100(folder, rng, dumps=dumps)
    ds = load_cifar100(folder)
    train, test = content["train"], content["test"]

    assert ds.train_images.shape == (6, 3, 32, 32) and ds.train_images.dtype == np.uint8
    assert ds.test_images.shape == (4, 3, 32, 32)
    raw = train["data"]
    # R, G, B planes of 1024 bytes each, row-major 32x32.
    np.testing.assert_array_equal(ds.train_images[:, 0], raw[:, :1024].reshape(-1, 32, 32))
    np.testing.assert_array_equal(ds.train_images[:, 1], raw[:, 1024:2048].reshape(-1, 32, 32))
    np.testing.assert_array_equal(ds.train_images[:, 2], raw[:, 2048:].reshape(-1, 32, 32))
    assert ds.train_images[2, 1, 5, 7] == raw[2, 1024 + 5 * 32 + 7]
    np.testing.assert_array_equal(ds.test_images[:, 2], test["data"][:, 2048:].reshape(-1, 32, 32))

    # Fine labels, not coarse ones.
    assert ds.train_labels.dtype == np.int64
    np.testing.assert_array_equal(ds.train_labels, train["fine_labels"])
    np.testing.assert_array_equal(ds.test_labels, test["fine_labels"])
    assert ds.class_names == FINE_NAMES
    assert ds.num_classes == 100
    assert ds.name == "cifar100" and ds.source == str(folder)

    assert ds.scale == pytest.approx(1 / 255)
    assert ds.mean == (0.5071, 0.4865, 0.4409) == CIFAR100_MEAN
    assert ds.std == (0.2673, 0.2564, 0.2762) == CIFAR100_STD
    np.testing.assert_array_equal(ds.holdout, np.zeros(6, dtype=bool))


def test_cifar100_normalisation_matches_the_lop_transform(cifar_dir):
    folder, content = cifar_dir
    ds = load_cifar100(folder)
    x = ds.normalized("train")
    raw = content["train"]["data"]
    v = raw[0, 0]  # red, row 0, col 0
    assert x[0, 0, 0, 0].item() == pytest.approx((v / 255 - 0.5071) / 0.2673, abs=1e-6)
    v = raw[3, 2048 + 31 * 32 + 31]  # blue, last pixel
    assert x[3, 2, 31, 31].item() == pytest.approx((v / 255 - 0.4409) / 0.2762, abs=1e-6)


def test_load_source_dispatches_to_cifar100(cifar_dir):
    folder, content = cifar_dir
    ds = load_source("cifar100", str(folder))
    np.testing.assert_array_equal(ds.train_labels, content["train"]["fine_labels"])


def test_cifar100_missing_meta(cifar_dir):
    folder, _ = cifar_dir
    (folder / "meta").unlink()
    with pytest.raises(DataError, match=r"missing \['meta'\]") as err:
        load_cifar100(folder)
    assert str(folder) in str(err.value)


def test_cifar100_folder_of_pngs(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(DataError, match="not a cifar-100-python folder") as err:
        load_cifar100(folder)
    msg = str(err.value)
    assert str(folder) in msg and "0.png" in msg and "'train'" in msg


def test_cifar100_missing_folder(tmp_path):
    folder = tmp_path / "nowhere"
    with pytest.raises(DataError, match="not a cifar-100-python folder") as err:
        load_cifar100(folder)
    assert str(folder) in str(err.value)


def test_cifar100_pickle_with_wrong_keys(cifar_dir):
    folder, content = cifar_dir
    train = content["train"]
    (folder / "train").write_bytes(_py2_pickle({"images": train["data"], "labels": [0] * 6}))
    with pytest.raises(DataError, match="key 'data' missing") as err:
        load_cifar100(folder)
    assert str(folder / "train") in str(err.value)


def test_cifar100_pickle_with_bytes_keys_is_rejected(cifar_dir):
    """A re-pickle with bytes keys (``encoding='bytes'`` style) is not the layout: a clear error."""
    folder, content = cifar_dir
    bad = {k.encode(): v for k, v in content["test"].items()}
    (folder / "test").write_bytes(_py3_pickle(bad))
    with pytest.raises(DataError, match="key 'data' missing") as err:
        load_cifar100(folder)
    assert str(folder / "test") in str(err.value)


@pytest.mark.parametrize("name", ["train", "test", "meta"])
def test_cifar100_truncated_pickle(cifar_dir, name):
    folder, _ = cifar_dir
    raw = (folder / name).read_bytes()
    (folder / name).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="not a readable CIFAR pickle") as err:
        load_cifar100(folder)
    assert str(folder / name) in str(err.value)


def test_cifar100_wrong_data_shape(cifar_dir, rng):
    folder, content = cifar_dir
    train = dict(content["train"], data=rng.integers(0, 256, size=(6, 1024), dtype=np.uint8))
    (folder / "train").write_bytes(_py2_pickle(train))
    with pytest.raises(DataError, match=r"uint8 \(N, 3072\)") as err:
        load_cifar100(folder)
    assert str(folder / "train") in str(err.value)


def test_cifar100_labels_and_images_disagree(cifar_dir):
    folder, content = cifar_dir
    train = dict(content["train"], fine_labels=content["train"]["fine_labels"][:-1])
    (folder / "train").write_bytes(_py2_pickle(train))
    with pytest.raises(DataError, match="6 images but 5 fine_labels") as err:
        load_cifar100(folder)
    assert str(folder / "train") in str(err.value)


# ---------------------------------------------------------------- npz


def _save_npz(path, x_train, y_train, x_test, y_test):
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def test_load_npz_nchw(tmp_path, rng):
    x_tr = rng.integers(0, 256, size=(5, 3, 4, 6), dtype=np.uint8)
    x_te = rng.integers(0, 256, size=(2, 3, 4, 6), dtype=np.uint8)
    path = _save_npz(tmp_path / "toy.npz", x_tr, np.array([0, 1, 2, 3, 1]), x_te, np.array([4, 0]))
    ds = load_npz(path)
    np.testing.assert_array_equal(ds.train_images, x_tr)
    np.testing.assert_array_equal(ds.test_images, x_te)
    assert ds.train_labels.dtype == np.int64 and ds.test_labels.dtype == np.int64
    assert ds.num_classes == 5  # the largest label (4, in the test split) + 1
    assert ds.name == "toy" and ds.source == str(path)
    assert ds.scale == pytest.approx(1 / 255)
    x = x_tr.astype(np.float64) / 255
    np.testing.assert_allclose(ds.mean, x.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(ds.std, x.std(axis=(0, 2, 3)), rtol=1e-12)


def test_load_npz_nhwc(tmp_path, rng):
    x_tr = rng.integers(0, 256, size=(4, 5, 6, 3), dtype=np.uint8)  # N, H, W, C
    x_te = rng.integers(0, 256, size=(2, 5, 6, 3), dtype=np.uint8)
    path = _save_npz(tmp_path / "toy.npz", x_tr, np.arange(4), x_te, np.arange(2))
    ds = load_npz(path, layout="nhwc")
    assert ds.train_images.shape == (4, 3, 5, 6)
    assert ds.test_images.shape == (2, 3, 5, 6)
    assert ds.train_images[1, 2, 3, 4] == x_tr[1, 3, 4, 2]
    np.testing.assert_array_equal(ds.train_images, x_tr.transpose(0, 3, 1, 2))
    # load_source passes the layout through
    np.testing.assert_array_equal(
        load_source("npz", str(path), layout="nhwc").test_images, x_te.transpose(0, 3, 1, 2)
    )


def test_load_npz_grayscale_nhw(tmp_path, rng):
    x_tr = rng.random((4, 5, 5)).astype(np.float32)
    x_te = rng.random((3, 5, 5)).astype(np.float32)
    path = _save_npz(tmp_path / "gray.npz", x_tr, np.arange(4) % 2, x_te, np.arange(3) % 2)
    ds = load_npz(path)
    assert ds.train_images.shape == (4, 1, 5, 5)
    np.testing.assert_array_equal(ds.train_images[:, 0], x_tr)
    assert ds.scale == 1.0  # float images are not rescaled
    assert len(ds.mean) == 1 and len(ds.std) == 1
    assert load_npz(path, scale=0.5).scale == 0.5


def test_load_npz_missing_keys(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, x_train=np.zeros((2, 4, 4)), y_train=np.zeros(2))
    with pytest.raises(DataError, match=r"missing arrays \['x_test', 'y_test'\]") as err:
        load_npz(path)
    assert str(path) in str(err.value)


def test_load_npz_missing_file(tmp_path):
    path = tmp_path / "absent.npz"
    with pytest.raises(DataError, match="file not found") as err:
        load_npz(path)
    assert str(path) in str(err.value)


def test_load_npz_given_a_single_npy_array(tmp_path):
    path = tmp_path / "images.npy"
    np.save(path, np.zeros((2, 4, 4)))
    with pytest.raises(DataError, match="not an .npz") as err:
        load_npz(path)
    assert str(path) in str(err.value)


def test_load_npz_corrupt_file(tmp_path):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"PK\x03\x04 definitely not a zip archive")
    with pytest.raises(DataError, match="not a readable .npz") as err:
        load_npz(path)
    assert str(path) in str(err.value)


def test_load_npz_inconsistent_arrays(tmp_path):
    path = _save_npz(tmp_path / "a.npz", np.zeros((3, 4, 4)), np.zeros(2), np.zeros((1, 4, 4)), [0])
    with pytest.raises(DataError, match="x_train has 3 samples but y_train 2 labels"):
        load_npz(path)
    path = _save_npz(tmp_path / "b.npz", np.zeros((2, 4, 4)), [0, 1], np.zeros((1, 5, 5)), [0])
    with pytest.raises(DataError, match="train inputs"):
        load_npz(path)
    path = _save_npz(tmp_path / "c.npz", np.zeros((2, 1, 1, 4, 4)), [0, 1], np.zeros((1, 4)), [0])
    with pytest.raises(DataError, match=r"must be vectors \(N, D\) or images") as err:
        load_npz(path)
    assert str(path) in str(err.value)


def test_load_source_errors(tmp_path):
    with pytest.raises(DataError, match="needs data.path"):
        load_source("npz")
    with pytest.raises(DataError, match="unknown data.source 'mnist'"):
        load_source("mnist", str(tmp_path))


# ---------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits(test_fraction=0.25, split_seed=0)


def test_digits_sizes_and_values(digits):
    assert len(digits.train_labels) + len(digits.test_labels) == 1797
    assert len(digits.test_labels) == 450  # ceil(0.25 * 1797)
    assert digits.train_images.shape == (1347, 1, 8, 8)
    assert digits.test_images.shape == (450, 1, 8, 8)
    assert digits.train_images.dtype == np.uint8 and digits.train_images.max() == 16
    assert digits.num_classes == 10 and digits.class_names == [str(d) for d in range(10)]
    assert digits.scale == 1 / 16
    mean, std = channel_stats(digits.train_images, 1 / 16)
    assert digits.mean == mean and digits.std == std
    assert load_source("digits").content_hash == digits.content_hash


def test_digits_split_is_stratified_and_complete(digits):
    from sklearn.datasets import load_digits as sk_load_digits

    full = sk_load_digits().target
    train_counts = np.bincount(digits.train_labels, minlength=10)
    test_counts = np.bincount(digits.test_labels, minlength=10)
    np.testing.assert_array_equal(train_counts + test_counts, np.bincount(full))
    assert np.all(np.abs(test_counts - 0.25 * np.bincount(full)) <= 1)
    # every image appears exactly once across the two splits
    both = np.concatenate([digits.train_images, digits.test_images]).reshape(1797, -1)
    full_images = sk_load_digits().images.astype(np.uint8).reshape(1797, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, full_images))


def test_digits_split_is_deterministic_per_seed(digits):
    again = load_digits(test_fraction=0.25, split_seed=0)
    np.testing.assert_array_equal(again.train_images, digits.train_images)
    np.testing.assert_array_equal(again.test_labels, digits.test_labels)
    other = load_source("digits", split_seed=1)
    assert other.content_hash != digits.content_hash
    assert len(other.test_labels) == 450


# ---------------------------------------------------------------- holdout


def test_holdout_mask_takes_the_first_images_of_each_class_in_data_order():
    labels = np.array([2, 0, 2, 1, 0, 2, 1, 0, 1, 2, 0, 1])
    expected = np.array([1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0], dtype=bool)
    np.testing.assert_array_equal(holdout_mask(labels, 2), expected)
    mask = holdout_mask(labels, 1)
    np.testing.assert_array_equal(np.flatnonzero(mask), [0, 1, 3])
    assert holdout_mask(labels, 0).dtype == bool and not holdout_mask(labels, 0).any()


def test_holdout_mask_lop_sizes():
    labels = np.repeat(np.arange(100), 500)[np.random.default_rng(0).permutation(50_000)]
    mask = holdout_mask(labels, 50)
    assert mask.sum() == 5000
    np.testing.assert_array_equal(np.bincount(labels[mask]), np.full(100, 50))
    first = np.flatnonzero(labels == 7)[:50]
    assert mask[first].all() and mask[labels == 7].sum() == 50


def test_holdout_mask_class_with_too_few_images():
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    with pytest.raises(DataError, match="class 1 has 2 training samples"):
        holdout_mask(labels, 2)  # would leave nothing of class 1 to train on
    assert holdout_mask(labels, 1).sum() == 3


# ---------------------------------------------------------------- Dataset, dataset.h5


def test_dataset_defaults(tiny_dataset):
    ds = Dataset(
        name="d",
        source="s",
        train_images=tiny_dataset.train_images,
        train_labels=[0, 1, 2] * 4,
        test_images=tiny_dataset.test_images,
        test_labels=[0, 1] * 3,
        num_classes=3,
        scale=1.0,
        mean=(0.0,) * 3,
        std=(1.0,) * 3,
    )
    assert ds.train_labels.dtype == np.int64
    np.testing.assert_array_equal(ds.holdout, np.zeros(12, dtype=bool))
    assert ds.class_names == ["0", "1", "2"]


def test_normalized_values(tiny_dataset):
    ds = tiny_dataset
    x = ds.normalized("train")
    assert x.dtype == torch.float32 and x.shape == (12, 3, 4, 4)
    mean = np.array(ds.mean).reshape(1, 3, 1, 1)
    std = np.array(ds.std).reshape(1, 3, 1, 1)
    expected = (ds.train_images.astype(np.float64) / 255 - mean) / std
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-5, atol=1e-5)
    idx = np.array([5, 0, 11])
    np.testing.assert_allclose(ds.normalized("train", idx).numpy(), expected[idx], atol=1e-5)
    expected_test = (ds.test_images.astype(np.float64) / 255 - mean) / std
    np.testing.assert_allclose(ds.normalized("test").numpy(), expected_test, atol=1e-5)


def test_unknown_split_is_an_error(tiny_dataset):
    np.testing.assert_array_equal(tiny_dataset.labels("test"), tiny_dataset.test_labels)
    np.testing.assert_array_equal(tiny_dataset.labels("train"), tiny_dataset.train_labels)
    with pytest.raises(ValueError, match="validation"):
        tiny_dataset.normalized("validation")
    with pytest.raises(ValueError, match="val"):
        tiny_dataset.labels("val")


def test_channel_stats_constant_channel_has_unit_std():
    images = np.zeros((3, 2, 2, 2), dtype=np.uint8)
    images[:, 1] = [[[0, 2], [2, 0]]]
    mean, std = channel_stats(images, 0.5)
    assert mean == (0.0, 0.5)
    assert std == (1.0, 0.5)


def test_content_hash_tracks_images_and_labels(tiny_dataset):
    h = tiny_dataset.content_hash
    assert len(h) == 64 and h == tiny_dataset.content_hash
    images = tiny_dataset.train_images.copy()
    images[0, 0, 0, 0] ^= 1
    assert Dataset(**{**vars(tiny_dataset), "train_images": images}).content_hash != h
    labels = tiny_dataset.test_labels.copy()
    labels[0] = 2
    assert Dataset(**{**vars(tiny_dataset), "test_labels": labels}).content_hash != h
    # Same bytes, different dtype: different data.
    as_int8 = tiny_dataset.train_images.view(np.int8)
    assert Dataset(**{**vars(tiny_dataset), "train_images": as_int8}).content_hash != h
    # Normalisation constants are not part of the content.
    assert Dataset(**{**vars(tiny_dataset), "mean": (0.0, 0.0, 0.0)}).content_hash == h


def test_content_hash_is_the_digest_of_whole_arrays_without_copying_them():
    """Hashed a block of rows at a time: the digest of each array's C-ordered bytes (views, a
    transposed layout), while the memory it takes stays a block, not a copy of the images."""
    import hashlib
    import tracemalloc

    from epochlens.data.blocks import BLOCK_BYTES, update_hash

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(50_000, 3, 32, 32), dtype=np.uint8)  # 154 MB
    for array in (images, images[::3], images.transpose(0, 2, 3, 1), np.arange(7.0), np.zeros((0, 4))):
        whole = np.ascontiguousarray(array)
        expected = hashlib.sha256(f"{whole.dtype.str}{whole.shape}".encode() + whole.tobytes()).hexdigest()
        h = hashlib.sha256()
        update_hash(h, array)
        assert h.hexdigest() == expected, array.shape
    ds = Dataset(
        "big", "test", images, np.arange(len(images)) % 10, images[:5], np.arange(5), 10, 1.0, (0.0,), (1.0,)
    )
    tracemalloc.start()
    assert len(ds.content_hash) == 64
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * BLOCK_BYTES < images.nbytes / 4


def test_write_read_round_trip(tmp_path, tiny_dataset):
    ds = tiny_dataset
    ds.holdout = holdout_mask(ds.train_labels, 1)
    path = tmp_path / "data" / "dataset.h5"
    write_dataset(ds, path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["dataset.h5"]  # no temp files left

    back = read_dataset(path)
    for key in ("train_images", "train_labels", "test_images", "test_labels", "holdout"):
        a, b = getattr(ds, key), getattr(back, key)
        assert a.dtype == b.dtype, key
        np.testing.assert_array_equal(a, b, err_msg=key)
    assert back.name == "tiny" and back.source == "conftest"
    assert back.num_classes == 3 and back.class_names == ["cat", "dog", "fox"]
    assert back.scale == ds.scale
    assert back.mean == ds.mean and back.std == ds.std
    assert back.content_hash == ds.content_hash
    with h5py.File(path, "r") as f:
        assert f.attrs["content_hash"] == ds.content_hash
        assert f["train/images"].shape == (12, 3, 4, 4)
        assert f["train/labels"].dtype == np.int64
        assert f["train/holdout"].dtype == bool
    torch.testing.assert_close(back.normalized("test"), ds.normalized("test"))


def test_groups_round_trip_and_enter_the_hash(tmp_path, tiny_dataset):
    """Cohorts from a data column (e.g. each image's source) survive dataset.h5; data without
    groups keeps its hash and reads back without them."""
    plain_hash = tiny_dataset.content_hash
    write_dataset(tiny_dataset, tmp_path / "plain.h5")
    assert read_dataset(tmp_path / "plain.h5").train_groups is None
    ds = dataclasses.replace(
        tiny_dataset,
        train_groups=np.arange(12) % 2,
        test_groups=np.arange(6) % 2,
        group_names=["clean", "noisy"],
    )
    assert ds.content_hash != plain_hash
    write_dataset(ds, tmp_path / "groups.h5")
    back = read_dataset(tmp_path / "groups.h5")
    np.testing.assert_array_equal(back.groups("train"), ds.train_groups)
    np.testing.assert_array_equal(back.groups("test"), ds.test_groups)
    assert back.group_names == ["clean", "noisy"] and back.content_hash == ds.content_hash


def test_write_read_round_trip_float_images(tmp_path, tiny_dataset):
    ds = Dataset(
        **{
            **vars(tiny_dataset),
            "train_images": tiny_dataset.train_images.astype(np.float32) / 255,
            "test_images": tiny_dataset.test_images.astype(np.float32) / 255,
            "scale": 1.0,
        }
    )
    write_dataset(ds, tmp_path / "dataset.h5")
    back = read_dataset(tmp_path / "dataset.h5")
    assert back.train_images.dtype == np.float32
    np.testing.assert_array_equal(back.test_images, ds.test_images)
    assert back.content_hash == ds.content_hash


@pytest.fixture
def written(tmp_path, tiny_dataset):
    path = tmp_path / "dataset.h5"
    write_dataset(tiny_dataset, path)
    return path


def test_read_dataset_truncated_file(written):
    raw = written.read_bytes()
    written.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="not a complete epochlens dataset.h5") as err:
        read_dataset(written)
    assert str(written) in str(err.value)


def test_read_dataset_not_hdf5(tmp_path):
    path = tmp_path / "dataset.h5"
    path.write_text("not hdf5 at all\n")
    with pytest.raises(DataError) as err:
        read_dataset(path)
    assert str(path) in str(err.value)


def test_read_dataset_missing_file(tmp_path):
    path = tmp_path / "missing" / "dataset.h5"
    with pytest.raises(DataError) as err:
        read_dataset(path)
    assert str(path) in str(err.value)


def test_read_dataset_flipped_bytes_in_the_labels(written):
    """Silent corruption of the stored numbers (a bad disk, a bad copy) fails the content hash."""
    with h5py.File(written, "r") as f:
        offset = f["train/labels"].id.get_offset()  # contiguous, uncompressed
    assert offset is not None
    raw = bytearray(written.read_bytes())
    raw[offset] ^= 0x01
    written.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="content hash mismatch") as err:
        read_dataset(written)
    assert str(written) in str(err.value)


def test_read_dataset_missing_member(written):
    with h5py.File(written, "a") as f:
        del f["train/holdout"]
    with pytest.raises(DataError, match="not a complete") as err:
        read_dataset(written)
    assert str(written) in str(err.value)


def test_write_dataset_failure_keeps_the_previous_file(written, tiny_dataset):
    before = written.read_bytes()
    broken = Dataset(**{**vars(tiny_dataset), "class_names": [object()]})  # not JSON-serialisable
    with pytest.raises(TypeError):
        write_dataset(broken, written)
    assert written.read_bytes() == before
    assert [p.name for p in written.parent.iterdir()] == [written.name]


def test_read_labels_reads_labels_groups_and_holdout_without_images(tmp_path, tiny_dataset):
    from epochlens.data.labels import read_labels

    tiny_dataset.train_groups = np.arange(12) % 3
    tiny_dataset.test_groups = np.zeros(6, dtype=np.int64)
    tiny_dataset.group_names = ["a", "b", "c"]
    tiny_dataset.holdout = np.arange(12) < 2
    write_dataset(tiny_dataset, tmp_path / "d.h5")
    train = read_labels(tmp_path / "d.h5", "train")
    np.testing.assert_array_equal(train.labels, tiny_dataset.train_labels)
    np.testing.assert_array_equal(train.holdout, tiny_dataset.holdout)
    assert list(train.group_of_each()[:4]) == ["a", "b", "c", "a"]
    test = read_labels(tmp_path / "d.h5", "test")
    assert test.holdout is None and set(test.group_of_each()) == {"a"}
    tiny_dataset.train_groups = tiny_dataset.test_groups = None
    tiny_dataset.group_names = []
    write_dataset(tiny_dataset, tmp_path / "plain.h5")
    assert read_labels(tmp_path / "plain.h5").group_of_each() is None
    with pytest.raises(DataError, match="not a complete epochlens dataset.h5"):
        read_labels(tmp_path / "missing.h5")
