"""A large ``.npz`` read by rows where np.savez stored it: the data set prepared from it is the one
read whole (images, labels, hash, statistics), in either layout, and bad values are refused alike."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from epochlens.data import stats, write_dataset
from epochlens.data.sources import load_npz
from epochlens.data.stored_npz import StoredRows, stored_members
from epochlens.errors import DataError


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "hw"])
def test_a_large_npz_is_read_by_rows_into_the_same_data_set(tmp_path, monkeypatch, layout):
    rng = np.random.default_rng(0)
    shape = {"nchw": (3, 4, 5), "nhwc": (4, 5, 3), "hw": (4, 5)}[layout]
    arrays = {
        "x_train": rng.integers(0, 256, (40, *shape), dtype=np.uint8),
        "y_train": np.arange(40) % 4,
        "x_test": rng.integers(0, 256, (8, *shape), dtype=np.uint8),
        "y_test": np.arange(8) % 4,
    }
    np.savez(tmp_path / "d.npz", **arrays)
    whole = load_npz(tmp_path / "d.npz", "nhwc" if layout == "nhwc" else "nchw")
    write_dataset(whole, tmp_path / "whole.h5")
    monkeypatch.setattr(stats, "WHOLE_VALUES", 100)  # both splits above it: read by rows
    by_rows = load_npz(tmp_path / "d.npz", "nhwc" if layout == "nhwc" else "nchw")
    assert isinstance(by_rows.train_images, StoredRows) and isinstance(by_rows.test_images, StoredRows)
    assert by_rows.train_images.shape == whole.train_images.shape
    np.testing.assert_array_equal(by_rows.train_images[3:9], whole.train_images[3:9])
    np.testing.assert_array_equal(by_rows.test_images[-1], whole.test_images[-1])
    np.testing.assert_array_equal(np.asarray(by_rows.train_images), whole.train_images)
    assert by_rows.content_hash == whole.content_hash
    np.testing.assert_allclose(by_rows.mean + by_rows.std, whole.mean + whole.std, rtol=1e-12)
    write_dataset(by_rows, tmp_path / "rows.h5")
    with h5py.File(tmp_path / "rows.h5") as a, h5py.File(tmp_path / "whole.h5") as b:
        for key in ("train/images", "test/images", "train/labels"):
            np.testing.assert_array_equal(a[key][()], b[key][()])


def test_nan_in_a_large_npz_is_refused_and_compressed_members_are_read_whole(tmp_path, monkeypatch):
    x = np.random.default_rng(1).random((30, 2, 3, 3)).astype(np.float32)
    x[17, 1, 2, 0] = np.nan
    arrays = {"x_train": x, "y_train": np.arange(30) % 3, "x_test": x[:6].copy(), "y_test": np.arange(6) % 3}
    arrays["x_test"][4] = 0.5
    np.savez(tmp_path / "d.npz", **arrays)
    monkeypatch.setattr(stats, "WHOLE_VALUES", 10)
    assert set(stored_members(tmp_path / "d.npz")) == set(arrays)
    with pytest.raises(
        DataError, match=r"'x_train' holds NaN or Inf values in 1 sample\(s\) \(positions \[17\]"
    ):
        load_npz(tmp_path / "d.npz")
    arrays["x_train"][17] = 0.25
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    assert stored_members(tmp_path / "c.npz") == {}
    data = load_npz(tmp_path / "c.npz")
    assert isinstance(data.train_images, np.ndarray)  # compressed: read as np.load reads it
