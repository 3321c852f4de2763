"""epochlens.job_time: each model job's runtime from the shapes of its run's files."""

from __future__ import annotations

from types import SimpleNamespace

import h5py
import pytest

from epochlens import job_time
from epochlens.job_time import FALLBACK_MINUTES, MAX_MINUTES, MIN_MINUTES, job_runtime, minutes
from epochlens.memory import RunShape


def _dataset(path, n_train, n_test=10_000):
    with h5py.File(path, "w") as f:  # CIFAR-shaped images, allocated lazily
        for split, n in (("train", n_train), ("test", n_test)):
            f.create_group(split).create_dataset(
                "images", shape=(n, 3, 32, 32), dtype="uint8", chunks=(256, 3, 32, 32)
            )
    return str(path)


def _checkpoint(path, mb):
    path.write_bytes(b"\0" * int(mb * 1e6))
    return str(path)


@pytest.mark.parametrize("rule", sorted(job_time.RULES))
def test_runtime_grows_with_the_samples_checkpoints_and_model_and_shrinks_with_shards(tmp_path, rule):
    small, large = _dataset(tmp_path / "s.h5", 50_000), _dataset(tmp_path / "l.h5", 200_000)
    resnet = _checkpoint(tmp_path / "resnet.pt", 45)
    one = SimpleNamespace(index="0")
    at = {
        n: job_runtime(rule, {"dataset": d, "checkpoint": resnet}, one)
        for n, d in (("s", small), ("l", large))
    }
    assert MIN_MINUTES <= at["s"] < at["l"] <= MAX_MINUTES
    expected = job_time.RULES[rule].seconds(RunShape(samples=210_000, model_bytes=45_000_000))
    assert at["l"] == min(MAX_MINUTES, round(expected * job_time.HEADROOM / 60 + 0.5))
    four = {"dataset": large, "checkpoints": [resnet] * 4}
    assert job_runtime(rule, four, one) > at["l"] or at["l"] == MAX_MINUTES
    quarter = job_runtime(
        rule, {"dataset": large, "checkpoint": resnet}, SimpleNamespace(shard="1", nshards="4")
    )
    assert quarter < at["l"]
    assert job_runtime(rule, {"dataset": small, "checkpoint": resnet}, one, attempt=2) == 2 * at["s"]


def test_floor_cap_and_fallback():
    assert minutes("evaluate_checkpoint", RunShape()) == MIN_MINUTES  # files not made yet
    assert minutes("curvature_shard", RunShape(samples=10**9, model_bytes=10**10)) == MAX_MINUTES
    assert minutes("lds_retrain", RunShape(samples=10)) == FALLBACK_MINUTES
    assert minutes("influence_eigenbasis", RunShape(), attempt=3) == 3 * FALLBACK_MINUTES
