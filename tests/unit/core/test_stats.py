"""Run-level probe and ablation tables: means and spreads over seeds and indices, by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from epochlens.ablation.summary import ablation_summary
from epochlens.probes.summary import probe_summary
from epochlens.stats import mean_ci, over_replicates


def probe_rows(
    index: int, accuracies: list[float], target: str = "class", chance: float = 0.25
) -> list[dict]:
    return [
        {
            "run": "r",
            "index": index,
            "epoch": 10,
            "layer": "block1",
            "representation": "pooled",
            "target": target,
            "seed": seed,
            "eval_split": "holdout",
            "n_features": 16,
            "n_classes": 4,
            "n_fit": 90 + index,  # per-seed counts differ and must not split groups
            "n_stop": 10,
            "n_eval": 20 + index,
            "accuracy": acc,
            "loss": 1.0 - acc,
            "chance": chance + 0.01 * index,
            "fit_accuracy": 1.0,
            "best_epoch": 5 + seed,
            "epochs_run": 15 + seed,
            "status": "ok",
        }
        for seed, acc in enumerate(accuracies)
    ]


def test_probe_summary_separates_seed_and_index_spread():
    per_seed = pd.DataFrame(probe_rows(0, [0.5, 0.7]) + probe_rows(1, [0.8, 0.8]) + probe_rows(2, [0.6, 0.9]))
    skipped = {"run": "r", "index": 0, "epoch": 10, "layer": "block1", "representation": "pooled"}
    per_seed = pd.concat(
        [per_seed, pd.DataFrame([{**skipped, "target": "cohort", "status": "skipped: first task"}])],
        ignore_index=True,
    )
    out = probe_summary(per_seed)
    assert list(out["target"]) == ["class", "cohort"]
    row = out.iloc[0]
    index_means = np.array([0.6, 0.8, 0.75])
    assert row["n_indices"] == 3 and row["n_seeds"] == 2
    assert row["accuracy_mean"] == pytest.approx(index_means.mean())
    assert row["accuracy_index_std"] == pytest.approx(index_means.std(ddof=1))
    assert row["accuracy_ci95"] == pytest.approx(stats.t.ppf(0.975, 2) * index_means.std(ddof=1) / np.sqrt(3))
    seed_stds = [np.std([0.5, 0.7], ddof=1), 0.0, np.std([0.6, 0.9], ddof=1)]
    assert row["accuracy_seed_std"] == pytest.approx(np.mean(seed_stds))
    assert row["chance"] == pytest.approx(0.26) and row["n_eval"] == pytest.approx(21)
    assert row["loss_mean"] == pytest.approx(1 - index_means.mean())
    skipped_row = out.iloc[1]
    assert skipped_row["status"] == "skipped: first task" and skipped_row["n_indices"] == 1
    assert np.isnan(skipped_row["accuracy_mean"]) and pd.isna(skipped_row["n_seeds"])


def test_one_index_has_no_interval():
    out = probe_summary(pd.DataFrame(probe_rows(0, [0.5, 0.7, 0.9])))
    assert out["n_indices"].tolist() == [1]
    assert np.isnan(out["accuracy_index_std"].iloc[0]) and np.isnan(out["accuracy_ci95"].iloc[0])
    assert out["accuracy_seed_std"].iloc[0] == pytest.approx(0.2)


def test_ablation_summary_over_indices():
    base = {
        "run": "r",
        "epoch": 4,
        "split": "test",
        "block": "block2",
        "group": "ch0-7",
        "channel_start": 0,
        "channel_stop": 8,
        "n_channels": 8,
        "mode": "zero",
        "accuracy_base": 0.9,
        "loss_base": 0.3,
    }
    rows = pd.DataFrame(
        [
            {**base, "index": i, "cohort": cohort, "n_samples": n, "accuracy": acc, "loss": 0.5}
            for i, (n, acc) in enumerate([(100, 0.7), (110, 0.8)])
            for cohort in ("old", "new")
        ]
    )
    rows["delta_accuracy"] = rows["accuracy"] - rows["accuracy_base"]
    rows["delta_loss"] = rows["loss"] - rows["loss_base"]
    out = ablation_summary(rows)
    assert list(out["cohort"]) == ["old", "new"]
    row = out.iloc[0]
    assert row["n_indices"] == 2 and row["n_samples"] == 105
    assert row["delta_accuracy_mean"] == pytest.approx(-0.15)
    assert row["delta_accuracy_std"] == pytest.approx(np.std([-0.2, -0.1], ddof=1))
    assert row["delta_loss_mean"] == pytest.approx(0.2) and row["delta_loss_std"] == pytest.approx(0.0)


def test_over_replicates_keeps_nan_keys_as_groups():
    table = pd.DataFrame({"k": ["a", "a", None], "x": [1.0, 3.0, 5.0]})
    out = over_replicates(table, ["k", "missing"], ["x"])
    assert out["n_indices"].tolist() == [2, 1]
    assert out["x_mean"].tolist() == [2.0, 5.0]


def test_mean_ci_is_the_student_t_interval_by_hand():
    mean, half = mean_ci(pd.Series([1.0, 2.0, 3.0, 4.0]))
    sd = np.sqrt(((np.array([1, 2, 3, 4]) - 2.5) ** 2).sum() / 3)
    assert mean == 2.5
    assert half == pytest.approx(stats.t.ppf(0.975, 3) * sd / 2.0, rel=1e-12)
    assert half == pytest.approx(2.0542, abs=1e-4)  # t(0.975, 3) = 3.1824
    assert mean_ci(np.array([7.0])) == (7.0, 0.0)  # one replicate: no band


def test_spearman_and_t_quantile_equal_scipy_stats():
    """The light jobs' Spearman (pandas ranks) and t quantile (scipy.special) are scipy.stats's."""
    from scipy import stats as scipy_stats

    from epochlens.stats import ci95_halfwidth, spearman

    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = x + rng.normal(size=200)
    y[::7] = y[0]  # ties
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)
    assert np.isnan(spearman([1.0, 2.0], [2.0, 1.0]))
    n = np.array([2, 3, 5, 30])
    expected = scipy_stats.t.ppf(0.975, n - 1) * 1.5 / np.sqrt(n)
    np.testing.assert_allclose(ci95_halfwidth(1.5, n), expected, rtol=1e-12)


def test_r2_score_is_scikit_learns_without_importing_it():
    from sklearn.metrics import r2_score as sklearn_r2

    from epochlens.stats import r2_score

    rng = np.random.default_rng(3)
    y = rng.standard_normal((20, 3))
    z = y + 0.5 * rng.standard_normal((20, 3))
    assert r2_score(y, z) == pytest.approx(sklearn_r2(y, z), rel=1e-12)
    assert r2_score(y[:, 0], z[:, 0]) == pytest.approx(sklearn_r2(y[:, 0], z[:, 0]), rel=1e-12)
    constant = np.column_stack([y[:, 0], np.ones(20)])  # an output with constant targets
    for pred in (np.column_stack([z[:, 0], np.ones(20)]), np.column_stack([z[:, 0], np.zeros(20)])):
        assert r2_score(constant, pred) == pytest.approx(sklearn_r2(constant, pred), rel=1e-12)
    assert np.isnan(r2_score(y[:1], z[:1]))
