"""The dossier's per-sample summaries against values computed by hand on tiny arrays."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from epochlens.samples import detectors, neighbours, summaries

NAN = np.nan


def test_cartography_by_hand():
    # 3 checkpoints x 3 samples; sample 2 is inactive at the first checkpoint
    p = np.array([[0.2, 0.9, NAN], [0.4, 0.9, 0.1], [0.9, 0.6, 0.3]])
    correct = np.array([[False, True, False], [False, True, False], [True, True, False]])
    out = summaries.cartography(p, correct)
    np.testing.assert_allclose(out["confidence"], [0.5, 0.8, 0.2])
    # population std: sample 0 = sqrt(((-.3)^2 + (-.1)^2 + .4^2) / 3) = sqrt(0.26/3)
    np.testing.assert_allclose(out["variability"], [np.sqrt(0.26 / 3), np.sqrt(0.02), 0.1])
    np.testing.assert_allclose(out["correctness"], [1 / 3, 1.0, 0.0])


def test_cartography_of_a_never_active_sample_is_nan():
    out = summaries.cartography(np.full((2, 1), NAN), np.zeros((2, 1), bool))
    assert all(np.isnan(v[0]) for v in out.values())


def test_aum_is_the_mean_margin_over_active_checkpoints():
    margin = np.array([[2.0, -1.0, NAN], [1.0, -3.0, 4.0], [0.0, 1.0, 2.0]])
    np.testing.assert_allclose(summaries.aum(margin), [1.0, -1.0, 3.0])


def test_forgetting_events_learning_time_and_csl():
    epochs = [0, 5, 10, 15]
    # sample 0: right, wrong, right, right -> 1 forgetting event, learned at 10
    # sample 1: wrong at the last checkpoint -> not learned, 1 event (right -> wrong at 15)
    # sample 2: inactive at 0, then right throughout -> learned at 5, no event
    correct = np.array([[1, 0, 0], [0, 0, 1], [1, 1, 1], [1, 0, 1]], bool)
    loss = np.array([[0.1, 2.0, NAN], [1.0, 1.0, 0.5], [0.2, 0.3, 0.25], [0.1, 4.0, 0.05]])
    out = summaries.loss_dynamics(epochs, loss, correct, np.array([0, 1, 2]))
    np.testing.assert_array_equal(out["forgetting_events"], [1, 1, 0])
    np.testing.assert_allclose(out["learning_time"], [10.0, NAN, 5.0])
    np.testing.assert_allclose(out["csl"], [1.4, 7.3, 0.8])


def test_regression_error_map():
    err = np.array([[1.0, 0.5], [3.0, 0.5]])
    out = summaries.error_map(err)
    np.testing.assert_allclose(out["error_mean"], [2.0, 0.5])
    np.testing.assert_allclose(out["error_variability"], [1.0, 0.0])


def test_curvature_summary_skips_uncomputed_checkpoints():
    curv = np.array([[1.0, NAN], [NAN, NAN], [3.0, NAN]])
    out = summaries.curvature_summary(curv)
    np.testing.assert_allclose(out["curvature_mean"], [2.0, NAN])
    np.testing.assert_allclose(out["curvature_max"], [3.0, NAN])


def test_top_k_neighbours_in_order_and_without_nan():
    scores = np.array([[0.5, NAN, -2.0, 3.0], [1.0, 2.0, NAN, NAN]])
    cols, vals = neighbours.top_k(scores, 2, largest=True)
    assert cols.to_pylist() == [[3, 0], [1, 0]]
    assert vals.to_pylist() == [[3.0, 0.5], [2.0, 1.0]]
    cols, vals = neighbours.top_k(scores, 5, largest=False)
    assert cols.to_pylist() == [[2, 0, 3], [0, 1]]


def test_rank_is_one_for_the_highest_and_missing_for_nan():
    ranks = neighbours.rank_descending(np.array([0.1, NAN, 5.0, 2.0]))
    assert [None if r is pd.NA else int(r) for r in ranks] == [3, None, 1, 2]


def test_detector_flags_above_tukeys_fence_of_the_trained_samples():
    scores = np.array([1.0, 2.0, 3.0, 4.0, 100.0, NAN, 50.0])
    trained = np.array([1, 1, 1, 1, 1, 1, 0], bool)
    # trained finite scores 1, 2, 3, 4, 100: Q1 = 2, Q3 = 4, fence = 4 + 1.5 * 2 = 7
    assert detectors.upper_fence(scores, trained) == pytest.approx(7.0)
    cols = detectors.detector_columns({"loss": scores}, trained)
    assert cols["is_loss"].tolist() == [False, False, False, False, True, False, True]
    np.testing.assert_array_equal(cols["loss_score"], scores)


def test_thumbnail_pixels_ink_on_paper_and_the_datas_own_range():
    from epochlens.samples.thumbnails import display_range, to_pixels

    grey = np.array([[[[0.0, 8.0], [16.0, 4.0]]]])  # stored 0..16, scale 1/16
    assert display_range(grey.min() / 16, grey.max() / 16) == (0.0, 1.0)
    np.testing.assert_array_equal(to_pixels(grey, 1 / 16)[0], [[255, 128], [0, 191]])  # 1 - x, rounded
    signed = np.array([[[[-2.0, 0.0], [2.0, 1.0]]]])  # a regression's matrix
    assert display_range(signed.min(), signed.max()) == (-2.0, 2.0)
    np.testing.assert_array_equal(to_pixels(signed, 1.0, (-2.0, 2.0))[0], [[255, 128], [0, 64]])
    rgb = np.zeros((1, 3, 2, 2))
    rgb[0, 0] = 1.0  # red
    assert to_pixels(rgb, 1.0).shape == (1, 2, 2, 3) and (to_pixels(rgb, 1.0)[0, :, :, 0] == 255).all()


def test_top_k_of_long_rows_is_a_stable_sorts_first_k():
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=(5, 3000)), 1)  # long rows (partitioned), many ties
    scores[0, :2995] = NAN  # fewer than k finite
    scores[1, ::2] = NAN
    for largest in (True, False):
        cols, vals = neighbours.top_k(scores, 10, largest)
        key = np.where(np.isfinite(scores), -scores if largest else scores, np.inf)
        for r in range(5):
            want = [c for c in np.argsort(key[r], kind="stable")[:10] if np.isfinite(scores[r, c])]
            assert cols[r].as_py() == want
            np.testing.assert_array_equal(vals[r].as_py(), scores[r, want])
