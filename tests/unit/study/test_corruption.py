"""Corrupted training sets, query transforms, detection metrics, and a small detection study."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from quality import SEED, above
from torch import nn

from epochlens.data import Dataset, load_digits
from epochlens.errors import ConfigError
from epochlens.influence import InfluenceSettings, fit_factors, pairwise_influence, self_influence
from epochlens.study.corruption import (
    apply_trigger,
    corrupt,
    flip_labels,
    plant_trigger,
    trigger_value,
)
from epochlens.study.detection import (
    DETECTION_COLUMNS,
    baseline_signals,
    detection_metrics,
    detection_table,
    query_signal,
    transform_agreement,
)


@pytest.fixture
def ds(rng: np.random.Generator) -> Dataset:
    """4 classes, 1x6x6 uint8 images scaled by 1/16 (digits-like), 40 train with 8 held out."""
    labels = np.tile(np.arange(4), 10)
    holdout = np.zeros(40, dtype=bool)
    holdout[:8] = True
    return Dataset(
        name="toy",
        source="test",
        train_images=rng.integers(0, 17, size=(40, 1, 6, 6), dtype=np.uint8),
        train_labels=labels,
        test_images=rng.integers(0, 17, size=(8, 1, 6, 6), dtype=np.uint8),
        test_labels=np.tile(np.arange(4), 2),
        num_classes=4,
        scale=1 / 16,
        mean=(0.5,),
        std=(0.3,),
        holdout=holdout,
    )


def test_flip_labels_changes_a_seeded_fraction_to_other_active_classes(ds: Dataset) -> None:
    active = np.array([0, 1, 2])
    bad, idx = flip_labels(ds, 0.25, seed=3, active_classes=active)
    eligible = np.flatnonzero(np.isin(ds.train_labels, active) & ~ds.holdout)
    assert len(idx) == round(0.25 * len(eligible)) and np.all(np.diff(idx) > 0)
    assert set(idx) <= set(eligible)  # never the holdout, never an inactive class
    assert np.all(bad.train_labels[idx] != ds.train_labels[idx])
    assert np.isin(bad.train_labels[idx], active).all()
    untouched = np.setdiff1d(np.arange(40), idx)
    np.testing.assert_array_equal(bad.train_labels[untouched], ds.train_labels[untouched])
    np.testing.assert_array_equal(bad.train_images, ds.train_images)
    assert bad.content_hash != ds.content_hash and ds.train_labels is not bad.train_labels
    assert bad.train_images is ds.train_images  # labels flipped: the images held once, not copied
    again, idx2 = flip_labels(ds, 0.25, seed=3, active_classes=active)
    np.testing.assert_array_equal(idx, idx2)
    np.testing.assert_array_equal(again.train_labels, bad.train_labels)
    assert not np.array_equal(flip_labels(ds, 0.25, seed=4, active_classes=active)[1], idx)
    assert "label_flip(fraction=0.25, seed=3" in bad.source


def test_flip_labels_refuses_impossible_requests(ds: Dataset) -> None:
    with pytest.raises(ConfigError, match="fraction=1.5 must be within"):
        flip_labels(ds, 1.5)
    with pytest.raises(ConfigError, match="at least two active classes"):
        flip_labels(ds, 0.1, active_classes=[2])
    with pytest.raises(ConfigError, match="rounds to none"):
        flip_labels(ds, 0.001)


def test_plant_trigger_stamps_a_corner_patch_and_relabels(ds: Dataset) -> None:
    bad, idx = plant_trigger(ds, 0.2, target_class=1, seed=0, patch_size=2, corner="top_left")
    assert len(idx) == round(0.2 * np.sum((ds.train_labels != 1) & ~ds.holdout))
    assert (ds.train_labels[idx] != 1).all() and not ds.holdout[idx].any()
    assert (bad.train_labels[idx] == 1).all()
    assert trigger_value(ds) == 16.0
    patch = bad.train_images[idx][:, :, :2, :2]
    np.testing.assert_array_equal(patch, np.broadcast_to(np.array([[16, 0], [0, 16]], np.uint8), patch.shape))
    # Only the patch of the poisoned images changed.
    diff = bad.train_images != ds.train_images
    assert not diff[np.setdiff1d(np.arange(40), idx)].any()
    assert not diff[:, :, 2:, :].any() and not diff[:, :, :, 2:].any()
    with pytest.raises(ConfigError, match="target_class=3 is not an active class"):
        plant_trigger(ds, 0.2, target_class=3, active_classes=[0, 1, 2])


def test_apply_trigger_on_queries_in_each_corner() -> None:
    images = np.zeros((2, 3, 5, 5), dtype=np.float32)
    out = apply_trigger(images, patch_size=3, corner="bottom_right", high=1.0)
    assert out[:, :, 2:, 2:].sum() == 2 * 3 * 5 and out[:, :, :2, :].sum() == 0
    assert apply_trigger(images, 1, "top_right", 7.0)[0, 0, 0, 4] == 7.0
    assert images.sum() == 0  # a copy
    with pytest.raises(ConfigError, match="corner="):
        apply_trigger(images, 1, "middle")


def test_detection_metrics_on_known_rankings() -> None:
    corrupted = np.array([1, 4])
    perfect = np.array([0.1, 0.9, 0.2, 0.3, 0.8, 0.0])
    m = detection_metrics(perfect, corrupted)
    assert m["auroc"] == 1.0 and m["precision_at_k"] == 1.0 and m["k"] == 2
    m = detection_metrics(-perfect, corrupted)
    assert m["auroc"] == 0.0 and m["precision_at_k"] == 0.0
    half = np.array([0.1, 0.9, 0.95, 0.3, 0.0, 0.2])  # one found in the top 2
    assert detection_metrics(half, corrupted)["precision_at_k"] == 0.5
    # NaN scores (skipped samples) are left out: here one of the corrupted ones.
    with_nan = perfect.copy()
    with_nan[4] = np.nan
    m = detection_metrics(with_nan, corrupted)
    assert m["k"] == 1 and m["n_scored"] == 5 and m["auroc"] == 1.0
    assert m["status"] == "ok"
    unknown = detection_metrics(perfect, np.zeros(6, bool))
    assert np.isnan(unknown["auroc"]) and "no corrupted samples known" in unknown["status"]
    assert "data.ground_truth" in unknown["status"]  # the fix, not a silent NaN
    everything = detection_metrics(perfect, np.ones(6, bool))
    assert everything["status"] == "every scored sample is corrupted"
    with pytest.raises(ValueError, match="corrupted indices must lie in"):
        detection_metrics(perfect, np.array([6]))


def test_detection_table_and_baselines() -> None:
    losses = np.array([0.1, 3.0, 0.2, 0.1, 2.5, np.nan])
    signals = {("ekfac", "self_influence"): losses * 10, **baseline_signals(losses, seed=0)}
    table = detection_table(signals, np.array([1, 4]), epoch=200, index=3)
    assert tuple(table.columns) == DETECTION_COLUMNS and len(table) == 3
    row = table.set_index(["method", "signal"]).loc[("loss", "loss")]
    assert row["auroc"] == 1.0 and row["epoch"] == 200 and row["index"] == 3
    rand = baseline_signals(losses, seed=0)[("random", "random")]
    assert np.isnan(rand[5]) and np.array_equal(
        rand, baseline_signals(losses, seed=0)[("random", "random")], True
    )


def test_query_signal_and_transform_agreement() -> None:
    pairwise = np.array([[1.0, 5.0, 2.0], [100.0, 400.0, 300.0], [np.nan, np.nan, np.nan]])
    s = query_signal(pairwise)
    assert np.argmax(s) == 1 and np.isfinite(s).all()  # the NaN query is ignored
    # Standardised: the large query does not dominate; raw: it does.
    assert np.argmin(query_signal(pairwise, standardize=False)) == 0
    assert query_signal(pairwise, queries=np.array([True, False, False]), sign=-1)[1] < 0
    agree = transform_agreement(
        {"none": np.arange(5.0), "hflip": np.arange(5.0) ** 2, "noise": -np.arange(5.0)}
    )
    assert isinstance(agree, pd.DataFrame) and len(agree) == 3
    rho = agree.set_index(["transform_a", "transform_b"])["spearman"]
    assert rho[("none", "hflip")] == pytest.approx(1.0) and rho[("none", "noise")] == pytest.approx(-1.0)


def _digits_subset(n: int) -> Dataset:
    full = load_digits()
    full.train_images, full.train_labels = full.train_images[:n], full.train_labels[:n]
    full.holdout = full.holdout[:n]
    return full


def _train_mlp(x: torch.Tensor, y: np.ndarray, steps: int = 100) -> nn.Module:
    """Full-batch Adam on a 64-32-10 MLP until it fits the (corrupted) labels."""
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    target = torch.as_tensor(y)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is faster on a shared machine
    try:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), target).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.mark.quality
def test_detection_study_finds_flipped_labels_by_self_influence() -> None:
    """Digits, 10% flipped labels, an MLP fitted to them: EK-FAC self-influence ranks them on top."""
    bad, idx = flip_labels(_digits_subset(300), 0.1, seed=SEED)
    x, y = bad.normalized("train"), bad.train_labels
    model = _train_mlp(x, y)
    active = np.arange(10)
    settings = InfluenceSettings(method="ekfac")
    selfs = self_influence(model, fit_factors(model, x, y, active, settings), x, y, active, settings)
    signals = {("ekfac", "self_influence"): selfs.scores, **baseline_signals(selfs.losses, seed=0)}
    table = detection_table(signals, idx, epoch=0, index=0).set_index("method")
    above("EK-FAC self-influence AUROC of the flipped labels", table.loc["ekfac", "auroc"], 0.85, table)
    chance = len(idx) / len(y)  # a random ranking's expected precision@k: the flipped fraction
    above(
        "EK-FAC precision@k / the flipped fraction", table.loc["ekfac", "precision_at_k"] / chance, 3, table
    )


@pytest.mark.quality
def test_detection_study_finds_a_backdoor_by_influence_on_misclassified_queries() -> None:
    """5% of digits carry a 2x2 trigger and label 0; test images with the trigger are predicted 0.

    Attributing those wrong predictions (queries scored under their predicted label) ranks the
    poisoned samples first; their loss alone does not (they are fitted as easily as the rest).
    """
    bad, idx = plant_trigger(_digits_subset(300), 0.05, target_class=0, seed=SEED, patch_size=2)
    x, y = bad.normalized("train"), bad.train_labels
    model = _train_mlp(x, y)
    triggered = apply_trigger(bad.test_images, 2, "bottom_right", trigger_value(bad))
    xq = (torch.from_numpy(triggered).float() * bad.scale - bad.mean[0]) / bad.std[0]
    with torch.no_grad():
        pred = model(xq).argmax(1).numpy()
    wrong = np.flatnonzero(pred != bad.test_labels)[:20]
    assert len(wrong) >= 10  # the backdoor works
    active = np.arange(10)
    settings = InfluenceSettings(method="ekfac")
    factors = fit_factors(model, x, y, active, settings)
    pair = pairwise_influence(model, factors, x, y, xq[wrong], pred[wrong], active, settings)
    selfs = self_influence(model, factors, x, y, active, settings)
    signals = {("ekfac", "query_influence"): query_signal(pair.scores), **baseline_signals(selfs.losses)}
    table = detection_table(signals, idx, epoch=0, index=0).set_index("method")
    above("EK-FAC query influence AUROC of the backdoor", table.loc["ekfac", "auroc"], 0.84, table)
    gain = table.loc["ekfac", "auroc"] - table.loc["loss", "auroc"]
    above("EK-FAC query influence - loss AUROC", gain, 0.1, table)


def test_label_flip_of_a_text_data_set_keeps_its_tokens():
    from epochlens.data import holdout_mask
    from epochlens.formats.text import TextSettings, load_polarity

    clean = load_polarity(TextSettings(max_length=16), train=80, test=8)
    clean.holdout = holdout_mask(clean.train_labels, 5)
    flipped, idx = corrupt(clean, {"kind": "label_flip", "fraction": 0.1, "seed": 0})
    assert len(idx) == 7 and not clean.holdout[idx].any()  # 10% of the 70 outside the holdout
    np.testing.assert_array_equal(flipped.train_labels[idx], 1 - clean.train_labels[idx])
    rest = np.setdiff1d(np.arange(80), idx)
    np.testing.assert_array_equal(flipped.train_labels[rest], clean.train_labels[rest])
    np.testing.assert_array_equal(flipped.train_input_ids, clean.train_input_ids)
    assert flipped.train_text == clean.train_text and flipped.content_hash != clean.content_hash
    with pytest.raises(ConfigError, match="trigger phrase is planted by epochlens.study.text_trigger"):
        corrupt(clean, {"kind": "trigger", "fraction": 0.1, "seed": 0})
