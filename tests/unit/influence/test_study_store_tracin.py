"""tracin_rp's checks that need no store (its scores against tracin's: the influence workflow test)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from epochlens.errors import InfluenceError
from epochlens.influence.study_store_tracin import _check_size, _rows_in


def _queries(q: int, transforms: int) -> SimpleNamespace:
    return SimpleNamespace(
        selected=SimpleNamespace(labels=np.zeros(q)), images=dict.fromkeys(range(transforms))
    )


def test_scores_past_pairwise_gb_are_refused_naming_the_setting():
    """1,000 queries x 2 transforms x 300,000 samples: 2.4 GB of float32, past the default 2."""
    job = SimpleNamespace(data=SimpleNamespace(train_labels=np.zeros(300_000)))
    params = {"settings": {"projection": {}}}
    with pytest.raises(
        InfluenceError, match=r"pass influence.projection.pairwise_gb \(2.0\).*raise pairwise_gb"
    ):
        _check_size(job, params, _queries(1000, 2))
    _check_size(job, {"settings": {"projection": {"pairwise_gb": 3}}}, _queries(1000, 2))
    _check_size(job, params, _queries(1000, 1))


def test_a_store_of_samples_the_influence_epoch_did_not_train_is_refused():
    positions = np.array([0, 2, 5, 7])
    np.testing.assert_array_equal(_rows_in(positions, np.array([2, 7]), 2, 6), [1, 3])
    with pytest.raises(
        InfluenceError, match="store of epoch 2 holds samples not trained at the influence epoch 6"
    ):
        _rows_in(positions, np.array([2, 3]), 2, 6)
    with pytest.raises(InfluenceError):
        _rows_in(positions, np.array([9]), 2, 6)


def test_the_sum_checkpoint_by_checkpoint_is_accumulate_tracins():
    """One (Q, N) total held instead of one a checkpoint: the same numbers, bit for bit (entries
    non-finite at some checkpoints, and at all of them)."""
    from epochlens.influence.accumulate import accumulate_tracin
    from epochlens.influence.study_store_tracin import _Sum

    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(3, 50)) for _ in range(4)]
    for part in parts:
        part[rng.random(part.shape) < 0.3] = np.nan
        part[:, 0] = np.nan
    total = _Sum()
    for part in parts:
        total.add(part)
    np.testing.assert_array_equal(total.value(), accumulate_tracin(parts))
    assert np.isnan(total.value()[:, 0]).all()
