"""A snapshot's columns that are not activations (a label, a text) beside its layers, and layers
asked for by pattern: left out and named in the log, resolved in the snapshot's order, and a bad
features.layers refused while the workflow plans (the dry run), not by a job."""

from __future__ import annotations

import logging
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest

from epochlens import config as run_config
from epochlens.errors import ConfigError, FeatureError
from epochlens.features.cache import FeatureSet
from epochlens.features.stored import Snapshot, load_or_build
from epochlens.features.stored_settings import StoredFeatureSettings

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"
N = {"train": 8, "test": 4}
LAYERS = [f"layer_{i:03d}" for i in (0, 1, 2, 10)]


class Labels:
    content_hash = "hash"

    def labels(self, split):
        return np.arange(N[split]) % 2


def write_snapshot(folder: Path, fmt: str) -> None:
    """Layers as Array2D columns and a label and a text column beside them, as a user's
    ``save_to_disk`` (or its parquet table) holds them."""
    rng = np.random.default_rng(0)
    features = {name: datasets.Array2D((3, 2), "float32") for name in LAYERS}
    features |= {"label": datasets.Value("int64"), "text": datasets.Value("string")}
    splits = {}
    for split, n in N.items():
        cols = {name: rng.normal(size=(n, 3, 2)).astype(np.float32) for name in LAYERS}
        cols |= {"label": np.arange(n) % 2, "text": [f"s{i}" for i in range(n)]}
        splits[split] = datasets.Dataset.from_dict(cols, features=datasets.Features(features))
    if fmt == "save_to_disk":
        datasets.DatasetDict(splits).save_to_disk(str(folder))
        return
    folder.mkdir(parents=True)
    for split, ds in splits.items():
        pq.write_table(ds.data.table, folder / f"{split}.parquet")


@pytest.mark.parametrize("fmt", ["save_to_disk", "parquet"])
def test_columns_that_are_not_activations_are_left_out_and_named_in_the_log(tmp_path, fmt, caplog):
    write_snapshot(tmp_path / "snap", fmt)
    snap = Snapshot(tmp_path / "snap", "auto")
    assert snap.layers("train") == LAYERS and snap.other_columns("train") == ["label", "text"]
    with caplog.at_level(logging.INFO, logger="epochlens"):
        load_or_build(tmp_path / "f.h5", tmp_path / "snap", Labels(), StoredFeatureSettings())
    assert FeatureSet(tmp_path / "f.h5").layers == LAYERS
    assert "columns ['label', 'text'] are not activations" in caplog.text


def test_layers_by_pattern_in_the_snapshots_order(tmp_path):
    write_snapshot(tmp_path / "snap", "save_to_disk")
    settings = StoredFeatureSettings(layers=["layer_01*", "layer_000"])
    load_or_build(tmp_path / "f.h5", tmp_path / "snap", Labels(), settings)
    assert FeatureSet(tmp_path / "f.h5").layers == ["layer_010", "layer_000"]
    for asked, match in (
        (["nope_*"], r"snap/train: no layer\(s\) \['nope_\*'\]"),
        (["layer_*", "label"], r"\['label'\] hold one value per row, not activations"),
    ):
        with pytest.raises(FeatureError, match=match):
            load_or_build(tmp_path / "g.h5", tmp_path / "snap", Labels(), StoredFeatureSettings(layers=asked))


def stored_run(tmp_path: Path, layers) -> dict:
    write_snapshot(tmp_path / "acts" / "step_1", "save_to_disk")
    return {
        "data": {"source": "digits", "holdout_per_class": 5},
        "schedule": "none",
        "checkpoints": {"source": "activations", "path": str(tmp_path / "acts" / "step_{epoch}")},
        "features": {"layers": layers, "representations": ["mean"]},
    }


def test_a_bad_features_layers_fails_the_dry_run(tmp_path):
    run_config.validate({"runs": {"acts": stored_run(tmp_path, ["layer_*"])}}, SCHEMA)
    for layers, match in ((["block_*"], r"no layer\(s\) \['block_\*'\]"), (["label"], "not activations")):
        with pytest.raises(ConfigError, match=rf"runs\.acts\.features\.layers: .*step_1/train: .*{match}"):
            run_config.validate({"runs": {"acts": stored_run(tmp_path, layers)}}, SCHEMA)


@pytest.mark.parametrize("fmt", ["npy", "safetensors"])
def test_a_file_of_one_value_per_row_beside_the_layer_files_is_not_a_layer(tmp_path, fmt, caplog):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    for split, n in N.items():
        (tmp_path / "snap" / split).mkdir(parents=True)
        files = {name: rng.normal(size=(n, 3, 2)).astype(np.float32) for name in LAYERS}
        files["labels"] = np.arange(n) % 2
        for name, array in files.items():
            path = tmp_path / "snap" / split / f"{name}.{fmt}"
            np.save(path, array) if fmt == "npy" else save_file({"x": np.ascontiguousarray(array)}, str(path))
    snap = Snapshot(tmp_path / "snap", fmt)
    assert snap.layers("train") == LAYERS and snap.other_columns("train") == ["labels"]
    with caplog.at_level(logging.INFO, logger="epochlens"):
        load_or_build(
            tmp_path / "f.h5", tmp_path / "snap", Labels(), StoredFeatureSettings(layers=["layer_*"])
        )
    assert FeatureSet(tmp_path / "f.h5").layers == LAYERS and "columns ['labels']" in caplog.text
    run = stored_run(tmp_path / "cfg", ["labels"])
    run["checkpoints"]["path"] = str(tmp_path / "snap{epoch}")
    (tmp_path / "snap").rename(tmp_path / "snap1")
    with pytest.raises(ConfigError, match=r"snap1/train: \['labels'\] hold one value per row"):
        run_config.validate({"runs": {"acts": run}}, SCHEMA)
