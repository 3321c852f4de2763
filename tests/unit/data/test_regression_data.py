"""Regression data: float targets kept as stored through every source and dataset.h5, vector inputs,
the data's kind checked against the task, and target noise as a corruption."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from epochlens.data import Dataset, holdout_mask, load_npz, read_dataset, write_dataset
from epochlens.data.dataset import check_kind, check_targets, target_dim
from epochlens.data.labels import read_data_kind, read_labels
from epochlens.errors import ConfigError, DataError
from epochlens.formats.tables import TableSettings, load_table
from epochlens.study.corruption import add_target_noise, corrupt


def _arrays(rng, n=30, d_in=9, d_out=9, dtype=np.float32):
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    y = rng.standard_normal((n, d_out)).astype(dtype)
    return x, y


def _npz(tmp_path, rng, y_dtype=np.float32, d_out=9):
    x_train, y_train = _arrays(rng, 30, d_out=d_out, dtype=y_dtype)
    x_test, y_test = _arrays(rng, 10, d_out=d_out, dtype=y_dtype)
    path = tmp_path / "inverse.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path, y_train


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_npz_float_targets_are_kept_as_stored_through_dataset_h5(tmp_path, rng, dtype) -> None:
    path, y_train = _npz(tmp_path, rng, dtype)
    ds = load_npz(path)
    assert ds.kind == "regression" and ds.num_classes == 0 and ds.class_names == []
    assert ds.train_labels.dtype == dtype and ds.train_labels.shape == (30, 9)
    np.testing.assert_array_equal(ds.train_labels, y_train)  # never cast to int
    assert ds.train_images.shape == (30, 9)  # vectors stay vectors
    ds.holdout = holdout_mask(ds.train_labels, 5)
    write_dataset(ds, tmp_path / "dataset.h5")
    back = read_dataset(tmp_path / "dataset.h5")
    assert back.kind == "regression" and back.train_labels.dtype == dtype
    np.testing.assert_array_equal(back.train_labels, y_train)
    assert read_data_kind(tmp_path / "dataset.h5") == "regression"
    labels = read_labels(tmp_path / "dataset.h5", "train")
    assert labels.labels.dtype == dtype and labels.labels.shape == (30, 9)
    np.testing.assert_array_equal(labels.holdout, np.arange(30) < 5)  # the first K samples


def test_regression_inputs_are_not_normalised_unless_asked(tmp_path, rng) -> None:
    path, _ = _npz(tmp_path, rng)
    raw = load_npz(path)
    np.testing.assert_array_equal(raw.normalized("train").numpy(), raw.train_images)
    scaled = load_npz(path, normalize="per_channel")
    x = scaled.normalized("train").numpy()
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)  # per feature
    np.testing.assert_allclose(x.std(0), 1, atol=1e-4)


def test_scalar_targets_and_class_ids(tmp_path, rng) -> None:
    path, _ = _npz(tmp_path, rng, d_out=1)
    x = np.load(path)
    np.savez(
        path, x_train=x["x_train"], y_train=x["y_train"][:, 0], x_test=x["x_test"], y_test=x["y_test"][:, 0]
    )
    ds = load_npz(path)
    assert ds.train_labels.shape == (30,) and target_dim(ds.train_labels) == 1
    np.savez(
        path, x_train=x["x_train"], y_train=np.arange(30) % 3, x_test=x["x_test"], y_test=np.arange(10) % 3
    )
    ds = load_npz(path)
    assert ds.kind == "classification" and ds.train_labels.dtype == np.int64 and ds.num_classes == 3


def test_targets_that_are_not_finite_floats_are_refused(rng) -> None:
    y = rng.standard_normal((5, 2))
    with pytest.raises(DataError, match="not floats"):
        check_targets(np.arange(5), y)
    bad = y.copy()
    bad[3, 1] = np.nan
    with pytest.raises(DataError, match=r"NaN or Inf \(rows \[3\]\)"):
        check_targets(bad, y)
    with pytest.raises(DataError, match="train targets"):
        check_targets(y, rng.standard_normal((5, 3)))


def test_data_kind_against_the_task(tmp_path, rng) -> None:
    path, _ = _npz(tmp_path, rng)
    ds = load_npz(path)
    check_kind(ds, "regression")
    with pytest.raises(DataError, match="float targets.*task is classification.*task: regression"):
        check_kind(ds, "classification")
    labelled = Dataset(
        "d",
        "s",
        ds.train_images,
        np.arange(30) % 2,
        ds.test_images,
        np.arange(10) % 2,
        2,
        1.0,
        (0.0,),
        (1.0,),
    )
    with pytest.raises(DataError, match=r"integers \(class ids\).*floats"):
        check_kind(labelled, "regression")


def _frame(rng, n, split):
    x, y = _arrays(rng, n, d_in=3, d_out=2, dtype=np.float64)
    return pd.DataFrame(
        {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "t0": y[:, 0], "t1": y[:, 1],
         "source": np.where(np.arange(n) % 2, "lab", "sim"), "split": split}
    )  # fmt: skip


@pytest.mark.parametrize("source", ["csv", "jsonl", "parquet", "save_to_disk"])
def test_tables_give_vector_inputs_and_float_targets(tmp_path, rng, source) -> None:
    df = pd.concat([_frame(rng, 12, "train"), _frame(rng, 6, "test")], ignore_index=True)
    path = tmp_path / f"data.{source}"
    if source == "csv":
        df.to_csv(path, index=False)
    elif source == "jsonl":
        df.to_json(path, orient="records", lines=True)
    elif source == "parquet":
        df.to_parquet(path)
    else:
        import datasets

        datasets.Dataset.from_pandas(df).save_to_disk(str(path))
    settings = TableSettings(
        input_columns=["a", "b", "c"],
        target_columns=["t0", "t1"],
        group_column="source",
        split_column="split",
    )
    ds = load_table(source, path, settings)
    assert (
        ds.kind == "regression" and ds.train_images.shape == (12, 3) and ds.train_images.dtype == np.float32
    )
    assert ds.train_labels.dtype == np.float64 and ds.train_labels.shape == (12, 2)
    train = df[df["split"] == "train"]
    np.testing.assert_allclose(ds.train_labels, train[["t0", "t1"]].to_numpy())
    assert ds.group_names == ["lab", "sim"] and ds.test_groups.tolist() == [1, 0, 1, 0, 1, 0]


def test_a_table_column_of_arrays_and_a_missing_column(tmp_path, rng) -> None:
    x, y = _arrays(rng, 8, d_in=4, d_out=1, dtype=np.float32)
    rows = [
        {"m": x[i].reshape(2, 2).tolist(), "y": float(y[i, 0]), "split": "train" if i < 6 else "test"}
        for i in range(8)
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ds = load_table(
        "jsonl", path, TableSettings(input_columns=["m"], target_columns=["y"], split_column="split")
    )
    assert ds.train_images.shape == (6, 2, 2) and ds.train_labels.shape == (6,)
    with pytest.raises(DataError, match=r"no column\(s\) \['z'\].*data\.table"):
        load_table(
            "jsonl", path, TableSettings(input_columns=["m"], target_columns=["z"], split_column="split")
        )
    with pytest.raises(ConfigError, match="target_columns .* or label_column"):
        TableSettings(input_columns=["m"])


def test_target_noise_corrupts_a_seeded_fraction_outside_the_holdout(tmp_path, rng) -> None:
    path, y = _npz(tmp_path, rng)
    ds = load_npz(path)
    ds.holdout = holdout_mask(ds.train_labels, 10)
    noisy, idx = add_target_noise(ds, 0.2, noise_scale=3.0, seed=1)
    assert len(idx) == 4 and not ds.holdout[idx].any()
    changed = np.flatnonzero((noisy.train_labels != ds.train_labels).any(1))
    np.testing.assert_array_equal(changed, idx)
    assert noisy.train_labels.dtype == np.float32
    shift = (noisy.train_labels - ds.train_labels)[idx] / ds.train_labels.std(0)
    assert 1.0 < shift.std() < 6.0  # about noise_scale standard deviations
    again, idx2 = corrupt(ds, {"kind": "target_noise", "fraction": 0.2, "noise_scale": 3.0, "seed": 1})
    np.testing.assert_array_equal(idx, idx2)
    np.testing.assert_array_equal(again.train_labels, noisy.train_labels)
    with pytest.raises(ConfigError, match="target_noise"):
        corrupt(ds, {"kind": "label_flip", "fraction": 0.2, "seed": 0})
