"""The {data} of a training command (epochlens.data.export): the inputs exactly as every stage
feeds them to the model, the labels as stored (regression targets never cast), holdout and groups."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from epochlens.data import Dataset, read_dataset, write_dataset
from epochlens.data.export import export_npz


def test_inputs_as_the_model_sees_them_and_labels_as_stored(tmp_path, tiny_dataset: Dataset) -> None:
    ds = dataclasses.replace(
        tiny_dataset,
        holdout=np.arange(12) < 3,
        train_groups=np.arange(12) % 2,
        test_groups=np.zeros(6, dtype=np.int64),
        group_names=["clean", "noisy"],
    )
    write_dataset(ds, tmp_path / "dataset.h5")
    shapes = export_npz(tmp_path / "dataset.h5", tmp_path / "data.npz")
    stored = read_dataset(tmp_path / "dataset.h5")
    with np.load(tmp_path / "data.npz") as f:
        assert shapes["x_train"] == (12, 3, 4, 4) and f["x_train"].dtype == np.float32
        np.testing.assert_array_equal(f["x_train"], stored.normalized("train").numpy())
        np.testing.assert_array_equal(f["x_test"], stored.normalized("test").numpy())
        assert f["y_train"].dtype == np.int64
        np.testing.assert_array_equal(f["y_train"], ds.train_labels)
        np.testing.assert_array_equal(f["holdout"], ds.holdout)
        np.testing.assert_array_equal(f["train_groups"], ds.train_groups)
        assert f["group_names"].tolist() == ["clean", "noisy"]


def test_regression_targets_keep_their_float_dtype(tmp_path, rng) -> None:
    if "kind" not in {f.name for f in dataclasses.fields(Dataset)}:
        pytest.skip("this Dataset has no regression kind")
    y = rng.standard_normal((10, 4))  # float64 on purpose: kept, not cast to float32 or int
    ds = Dataset(
        name="inv",
        source="test",
        train_images=rng.standard_normal((10, 4)).astype(np.float32),
        train_labels=y,
        test_images=rng.standard_normal((5, 4)).astype(np.float32),
        test_labels=rng.standard_normal((5, 4)),
        num_classes=0,
        scale=1.0,
        mean=(0.0,),
        std=(1.0,),
        kind="regression",
    )
    write_dataset(ds, tmp_path / "dataset.h5")
    export_npz(tmp_path / "dataset.h5", tmp_path / "data.npz")
    with np.load(tmp_path / "data.npz") as f:
        assert f["y_train"].dtype == np.float64
        np.testing.assert_array_equal(f["y_train"], y)
        assert "train_groups" not in f.files
