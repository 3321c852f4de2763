"""Shard ranges and merging of curvature shards (epochlens.curvature.io)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from epochlens.curvature.io import ARRAY_DTYPES, merge_shards, merged_names, write_shard
from epochlens.errors import EpochlensError
from epochlens.shards import shard_range


@pytest.mark.parametrize("n, nshards", [(10, 1), (10, 3), (1347, 2), (5, 5), (3, 4)])
def test_shard_ranges_tile_the_samples(n, nshards):
    ranges = [shard_range(n, k, nshards) for k in range(nshards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


def _write_shards(folder, n, nshards, labels):
    rng = np.random.default_rng(0)
    paths = []
    for k in range(nshards):
        lo, hi = shard_range(n, k, nshards)
        active = labels[lo:hi] < 2
        arrays = {key: np.where(active, rng.random(hi - lo), np.nan) for key in ARRAY_DTYPES}
        arrays.update(correct=active, labels=labels[lo:hi], holdout=np.zeros(hi - lo, bool))
        header = {
            "epoch": 3,
            "allowed_classes": [0, 1],
            "estimator": {"h": 1e-3},
            "n_samples": n,
            "nshards": nshards,
            "device": "cpu",
            "compute_time_seconds": 1.5,
            "inputs": {"dataset": "abc"},
        }
        paths.append(folder / f"shard_{k}.npz")
        write_shard(paths[-1], lo, hi, arrays, header)
    return paths


def test_merge_concatenates_and_summarises(tmp_path):
    labels = np.arange(10) % 3
    paths = _write_shards(tmp_path, 10, 3, labels)
    outputs = {key: tmp_path / name for key, name in merged_names().items()} | {
        "metadata": tmp_path / "m.json"
    }
    meta = merge_shards(paths[::-1], outputs, {"h": 1e-3})
    assert np.array_equal(np.load(outputs["labels"]), labels)
    curv = np.load(outputs["curvature"])
    assert curv.dtype == np.float32 and np.isnan(curv[labels == 2]).all()
    assert meta["compute_time_seconds"] == pytest.approx(4.5)
    assert meta["stats"]["n_active"] == 7 and meta["stats"]["n_inactive"] == 3
    assert json.loads(outputs["metadata"].read_text())["allowed_classes"] == [0, 1]


def test_merge_names_a_missing_shard(tmp_path):
    paths = _write_shards(tmp_path, 10, 3, np.zeros(10, int))
    outputs = {key: tmp_path / name for key, name in merged_names().items()} | {
        "metadata": tmp_path / "m.json"
    }
    with pytest.raises(EpochlensError, match="a shard is missing"):
        merge_shards([paths[0], paths[2]], outputs, {})
    assert not outputs["metadata"].exists()
