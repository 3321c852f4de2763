"""The data-quality study's steps around the influence engine: queries, TracIn sums, signals, tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from epochlens.data import Dataset
from epochlens.errors import ConfigError
from epochlens.study.poison import (
    accumulate_tracin,
    influence_settings,
    reduce_query_influence,
    roc_table,
    study_signals,
    top_ranked,
)
from epochlens.study.queries import select_queries


class Fixed(nn.Module):
    """Logits that prefer class ``favourite`` everywhere, except for images whose top-left pixel is
    bright, which prefer class 3."""

    def __init__(self, favourite: int) -> None:
        super().__init__()
        self.favourite = favourite

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(x), 4)
        logits[:, self.favourite] = 1.0
        logits[x[:, 0, 0, 0] > 0.5, 3] = 2.0
        return logits


@pytest.fixture
def ds() -> Dataset:
    labels = np.tile(np.arange(4), 5)
    return Dataset(
        name="toy",
        source="test",
        train_images=np.zeros((8, 1, 4, 4), np.uint8),
        train_labels=np.arange(8) % 4,
        test_images=np.zeros((20, 1, 4, 4), np.uint8),
        test_labels=labels,
        num_classes=4,
        scale=1 / 16,
        mean=(0.0,),
        std=(1.0,),
    )


def test_misclassified_queries_and_their_labels(ds: Dataset) -> None:
    cpu = torch.device("cpu")
    q = select_queries(Fixed(1), ds, np.array([0, 1, 2]), cpu)
    # Test images of the active classes 0-2 that are not class 1 (the model always says 1).
    expected = np.flatnonzero(np.isin(ds.test_labels, [0, 2]))
    np.testing.assert_array_equal(q.test_indices, expected)
    np.testing.assert_array_equal(q.labels, ds.test_labels[expected])  # correct labels by default
    assert (q.predicted == 1).all() and q.sign == -1.0 and q.candidates == len(expected)
    pred = select_queries(Fixed(1), ds, np.array([0, 1, 2]), cpu, labels="predicted", max_count=4, seed=3)
    assert len(pred.labels) == 4 and (pred.labels == 1).all() and pred.sign == 1.0
    assert set(pred.test_indices) <= set(expected) and np.all(np.diff(pred.test_indices) > 0)
    again = select_queries(Fixed(1), ds, np.array([0, 1, 2]), cpu, labels="predicted", max_count=4, seed=3)
    np.testing.assert_array_equal(again.test_indices, pred.test_indices)
    everything = select_queries(Fixed(1), ds, np.array([0, 1, 2]), cpu, select="all")
    assert len(everything.labels) == 15
    with pytest.raises(ConfigError, match="queries.select='wrong'"):
        select_queries(Fixed(1), ds, np.array([0, 1]), cpu, select="wrong")


def test_trigger_queries_are_stamped_and_exclude_the_target(ds: Dataset) -> None:
    trigger = {"target_class": 3, "patch_size": 1, "corner": "top_left"}
    q = select_queries(Fixed(0), ds, np.arange(4), torch.device("cpu"), labels="predicted", trigger=trigger)
    # The stamped pixel (16 x 1/16 = 1.0 normalised) turns every prediction into the target, 3.
    np.testing.assert_array_equal(q.test_indices, np.flatnonzero(ds.test_labels != 3))
    assert q.triggered and (q.predicted == 3).all() and (q.labels == 3).all()
    assert float(q.images[:, 0, 0, 0].min()) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="target class 3 is not trained"):
        select_queries(Fixed(0), ds, np.arange(3), torch.device("cpu"), trigger=trigger)


def test_tracin_counts_each_image_where_its_class_was_trained() -> None:
    parts = [np.array([1.0, np.nan, np.nan]), np.array([2.0, 3.0, np.nan])]
    total = accumulate_tracin(parts, weights=[1.0, 0.5])
    np.testing.assert_allclose(total[:2], [2.0, 1.5])
    assert np.isnan(total[2])
    pair = accumulate_tracin([np.ones((2, 3)), np.full((2, 3), np.nan)])
    np.testing.assert_array_equal(pair, np.ones((2, 3)))


def test_query_reductions() -> None:
    # Query 0: image 2 hurts it badly (negative influence under the correct label); query 1: none.
    pairwise = np.array([[0.0, 0.1, -5.0, 0.2], [1.0, 1.1, 0.9, 1.0], [np.nan] * 4])
    worst = reduce_query_influence(pairwise, sign=-1.0, reduce="max")
    assert np.argmax(worst) == 2 and np.isfinite(worst).all()
    mean = reduce_query_influence(pairwise, sign=-1.0, reduce="mean")
    assert mean.shape == (4,) and np.argmax(mean) == 2
    assert np.isnan(reduce_query_influence(np.full((2, 3), np.nan), reduce="max")).all()
    assert np.isnan(reduce_query_influence(np.zeros((0, 3)), reduce="max")).all()
    signals = study_signals("ekfac", np.arange(4.0), {"none": pairwise, "hflip": pairwise}, -1.0)
    assert set(signals) == {
        ("ekfac", "self_influence"),
        ("ekfac", "query_influence"),
        ("ekfac", "query_influence_hflip"),
    }


def test_roc_and_top_ranked_tables() -> None:
    signals = {("m", "s"): np.array([0.9, 0.1, 0.8, np.nan, 0.2]), ("r", "r"): np.zeros(5)}
    corrupted = np.array([0, 2])
    roc = roc_table(signals, corrupted)
    perfect = roc[roc["method"] == "m"]
    assert perfect["fpr"].iloc[0] == 0 and perfect["tpr"].max() == 1
    top = top_ranked(signals, corrupted, labels=np.array([1, 0, 1, 0, 1]), k=2)
    m = top[top["method"] == "m"]
    assert list(m["sample"]) == [0, 2] and m["corrupted"].all() and list(m["rank"]) == [1, 2]
    assert list(top[top["method"] == "r"]["sample"]) == [0, 1]  # ties: by position
    assert roc_table({("m", "s"): np.ones(3)}, np.array([], np.int64)).empty


def test_influence_settings_from_the_config() -> None:
    s = influence_settings(
        {"method": "ekfac", "fisher": True, "layers": ["fc"], "damping": 0.01, "queries": {}},
        {"train_batch_size": 7, "other": 1},
    )
    assert s.fisher == "true" and s.layers == ("fc",) and s.damping == 0.01 and s.train_batch_size == 7


# ---------------------------------------------------------------- regression
def regression_data(rng_seed: int = 0) -> Dataset:
    rng = np.random.default_rng(rng_seed)
    x = rng.standard_normal((30, 4)).astype(np.float32)
    y = rng.standard_normal((30, 2)).astype(np.float32)
    return Dataset("reg", "test", x[:20], y[:20], x[20:], y[20:], 0, 1.0, (0.0,), (1.0,), kind="regression")


def test_regression_queries_are_all_or_the_highest_losses() -> None:
    from epochlens.study.queries import select_regression_queries

    data = regression_data()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    with torch.no_grad():
        loss = ((model(torch.from_numpy(data.test_images)) - torch.from_numpy(data.test_labels)) ** 2).mean(1)
    worst = select_regression_queries(model, data, torch.device("cpu"), "highest_loss", max_count=3)
    np.testing.assert_array_equal(worst.test_indices, np.sort(np.argsort(-loss.numpy())[:3]))
    np.testing.assert_array_equal(worst.labels, data.test_labels[worst.test_indices])  # its own targets
    assert worst.labels.dtype == np.float32 and worst.predicted.shape == (3, 2) and worst.sign == -1.0
    every = select_regression_queries(model, data, torch.device("cpu"), "all", max_count=50)
    np.testing.assert_array_equal(every.test_indices, np.arange(10))
    subset = select_regression_queries(model, data, torch.device("cpu"), "all", max_count=4, seed=1)
    assert len(subset.test_indices) == 4 and subset.candidates == 10
    with pytest.raises(ConfigError, match="no misclassified"):
        select_regression_queries(model, data, torch.device("cpu"), "misclassified")


def test_top_ranked_lists_a_regressions_targets() -> None:
    targets = np.array([[0.5, -1.25], [2.0, 0.0], [0.1, 0.2]], np.float32)
    top = top_ranked({("ekfac", "self_influence"): np.array([0.1, 3.0, 2.0])}, np.array([1]), targets, 2)
    assert list(top["target"]) == ["[2, 0]", "[0.1, 0.2]"] and "label" not in top
    assert list(top["corrupted"]) == [True, False]
