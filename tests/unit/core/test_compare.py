"""Runs compared (epochlens.compare): per-run Student-t intervals and Welch's difference against
scipy, the metrics read from each table format, and the test split's fingerprint."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.stats

from epochlens.compare import (
    NO_SPREAD,
    TABLE_COLUMNS,
    VALUE_COLUMNS,
    check_same_samples,
    checkpoint_values,
    compare_runs,
    comparison_tables,
    run_summary,
    split_fingerprint,
    welch,
)
from epochlens.errors import DataError

SAMPLES = [
    ([0.91, 0.93, 0.92, 0.95, 0.90, 0.94, 0.92, 0.93, 0.91, 0.96], [0.88, 0.85, 0.90, 0.86, 0.87]),
    ([1.0, 2.0], [0.5, 0.7, 3.0]),  # two seeds against three, very different spreads
    ([0.2, 0.25, 0.21], [0.2, 0.25, 0.21]),  # no difference: p = 1
]


@pytest.mark.parametrize(("a", "b"), SAMPLES)
def test_welch_equals_scipy_ttest_ind(a, b):
    ours = welch(a, b)
    ref = scipy.stats.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(confidence_level=0.95)
    assert ours["difference"] == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12, abs=1e-15)
    assert ours["p_value"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert ours["t"] == pytest.approx(ref.statistic, rel=1e-10, abs=1e-15)
    assert ours["welch_df"] == pytest.approx(ref.df, rel=1e-10)
    assert ours["difference_ci95_low"] == pytest.approx(ci.low, rel=1e-10)
    assert ours["difference_ci95_high"] == pytest.approx(ci.high, rel=1e-10)
    assert ours["note"] == ""


@pytest.mark.parametrize("values", [[0.5, 0.7], [0.91, 0.93, 0.92, 0.95, 0.90], list(range(10))])
def test_run_interval_is_scipys_student_t_interval(values):
    v = np.asarray(values, dtype=float)
    low, high = scipy.stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=scipy.stats.sem(v))
    s = run_summary(v)
    assert (s["n"], s["mean"], s["std"]) == (len(v), pytest.approx(v.mean()), pytest.approx(v.std(ddof=1)))
    assert (s["ci95_low"], s["ci95_high"]) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))


@pytest.mark.parametrize(("a", "b"), [([0.9, 0.9, 0.9], [0.8, 0.8]), ([0.1, 0.1, 0.1], [0.3, 0.3])])
def test_no_spread_in_either_run_is_a_marked_row_not_a_nan(a, b):
    """Equal values in each run (0.1 three times: NumPy's mean is off by an ulp, which must not
    make a tiny variance and a 'significant' p-value)."""
    d = welch(a, b)
    assert d["difference"] == pytest.approx(a[0] - b[0])
    assert d["p_value"] is None and d["difference_ci95_low"] is None
    assert d["note"] == NO_SPREAD
    assert run_summary(a)["std"] == 0 and run_summary(a)["ci95_low"] == run_summary(a)["mean"]


@pytest.mark.parametrize(("values", "match"), [([0.9], "needs 2 or more"), ([0.9, np.nan], "not all finite")])
def test_too_few_or_nonfinite_values_are_refused(values, match):
    with pytest.raises(ValueError, match=match):
        run_summary(values)
    with pytest.raises(DataError, match=f"run b: .*{match}"):
        compare_runs({"a": pd.Series([1.0, 2.0]), "b": pd.Series(values)}, {"a": 5, "b": 5})


def test_differences_against_the_baseline_or_every_earlier_run():
    values = {
        "a": pd.Series([1.0, 2.0, 3.0], index=[0, 1, 2]),
        "b": pd.Series([2.0, 3.5], index=[0, 1]),
        "c": pd.Series([0.0, 1.0, 0.5], index=[3, 4, 5]),
    }
    epochs = {"a": 10, "b": 10, "c": 8}
    base = compare_runs(values, epochs)
    assert list(base.columns) == list(TABLE_COLUMNS[3:])
    assert list(zip(base["run"], base["versus"], strict=True)) == [("a", ""), ("b", "a"), ("c", "a")]
    assert base["difference"].iloc[0] != base["difference"].iloc[0]  # the baseline's row: none
    assert base.loc[1, "difference"] == pytest.approx(2.75 - 2.0)
    assert list(base["n"]) == [3, 2, 3] and list(base["epoch"]) == [10, 10, 8]
    pairs = compare_runs(values, epochs, "all_pairs")
    assert list(zip(pairs["run"], pairs["versus"], strict=True)) == [
        ("a", ""),
        ("b", "a"),
        ("c", "a"),
        ("c", "b"),
    ]
    assert pairs.loc[3, "difference"] == pytest.approx(0.5 - 2.75)


def per_class_table() -> pd.DataFrame:
    """tables/accuracy_per_class.csv of 2 indices at epochs 10 and 20: two classes, uneven n."""
    rows = []
    for index in (0, 1):
        for epoch in (10, 20):
            for split, scale in (("test", 1), ("holdout", 0)):
                for cls, n, correct, loss in (
                    (0, 30, 27 - index, 0.3),
                    (1, 10, 5 + epoch // 10, 1.1 + index),
                ):
                    n_ = n if scale else 5
                    rows.append(
                        dict(
                            index=index,
                            epoch=epoch,
                            split=split,
                            class_id=cls,
                            n=n_,
                            n_correct=min(correct, n_),
                            accuracy=min(correct, n_) / n_,
                            mean_loss=loss,
                        )
                    )
    return pd.DataFrame(rows)


def test_accuracy_and_loss_of_a_checkpoint_from_the_per_class_table():
    table = per_class_table()
    acc = checkpoint_values(table, "accuracy", "accuracy", 20, "test", [0, 1])
    # index 0: (27 + 7) / 40; index 1: (26 + 7) / 40 -- samples, not classes, weigh
    assert acc.to_dict() == {0: pytest.approx(34 / 40), 1: pytest.approx(33 / 40)}
    loss = checkpoint_values(table, "accuracy", "loss", 10, "test", [1, 0])
    assert list(loss.index) == [1, 0]
    assert loss[0] == pytest.approx((30 * 0.3 + 10 * 1.1) / 40) and loss[1] == pytest.approx((9 + 21.0) / 40)
    holdout = checkpoint_values(table, "accuracy", "accuracy", 10, "holdout", [0, 1])
    assert holdout[0] == pytest.approx((5 + 5) / 10)


def test_an_index_without_rows_at_the_checkpoint_is_an_error_naming_the_file():
    with pytest.raises(DataError, match=r"acc.csv: no rows for indices \[2\] at epoch 20, split test"):
        checkpoint_values(per_class_table(), "accuracy", "accuracy", 20, "test", [0, 1, 2], "acc.csv")
    with pytest.raises(DataError, match="no rows for indices"):
        checkpoint_values(per_class_table(), "accuracy", "accuracy", 30, "test", [0, 1])


def regression_table() -> pd.DataFrame:
    """tables/regression_metrics.csv as the regression evaluation writes it: whole split (all) and
    data groups, test and holdout, two indices."""
    rows = []
    for index in (0, 1, 2):
        for split in ("test", "holdout"):
            for group, n in (("all", 100), ("hard", 30), ("easy", 70)):
                mse = (
                    0.1 * (index + 1) + (0.05 if split == "holdout" else 0) + (0.2 if group == "hard" else 0)
                )
                rows.append(
                    dict(
                        run="reg",
                        index=index,
                        epoch=5,
                        split=split,
                        data_group=group,
                        n=n,
                        mean_loss=mse,
                        mse=mse,
                        mae=mse / 2,
                        r2=1 - mse,
                    )
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("mse", [0.1, 0.2, 0.3]),
        ("mae", [0.05, 0.1, 0.15]),
        ("r2", [0.9, 0.8, 0.7]),
        ("loss", [0.1, 0.2, 0.3]),
    ],
)
def test_regression_metrics_of_the_whole_split(metric, expected):
    values = checkpoint_values(regression_table(), "regression", metric, 5, "test", [0, 1, 2])
    assert values.to_numpy() == pytest.approx(expected)
    holdout = checkpoint_values(regression_table(), "regression", "mse", 5, "holdout", [0])
    assert holdout[0] == pytest.approx(0.15)


def test_a_regression_comparison_end_to_end_on_hand_made_tables():
    base, other = regression_table(), regression_table()
    other["mse"] = other["mse"] + np.where(other["index"] == 1, 0.07, 0.02)
    plan = [
        {
            "name": "strategies",
            "metrics": ["mse"],
            "split": "test",
            "differences": "baseline",
            "runs": [{"run": "a", "epoch": 5}, {"run": "b", "epoch": 5}],
        }
    ]
    values = {
        ("strategies", run, "mse"): checkpoint_values(t, "regression", "mse", 5, "test", [0, 1, 2])
        for run, t in (("a", base), ("b", other))
    }
    table, long = comparison_tables(plan, values)
    assert list(table.columns) == list(TABLE_COLUMNS) and list(long.columns) == list(VALUE_COLUMNS)
    a, b = [0.1, 0.2, 0.3], [0.12, 0.27, 0.32]
    ref = scipy.stats.ttest_ind(b, a, equal_var=False)
    row = table[table["run"] == "b"].iloc[0]
    assert row["p_value"] == pytest.approx(ref.pvalue) and row["versus"] == "a"
    assert long["value"].tolist() == pytest.approx(a + b)
    assert set(long["split"]) == {"test"} and list(long["index"]) == [0, 1, 2, 0, 1, 2]


def test_mean_curvature_over_the_cohorts_weighted_by_their_images():
    cohorts = pd.DataFrame(
        {
            "run": "r",
            "index": [0, 0, 0, 0, 1, 1, 1],
            "epoch": [6, 6, 6, 6, 6, 6, 4],
            "group": ["cohort 0", "cohort 1", "old", "new", "cohort 0", "cohort 1", "cohort 0"],
            "cohort": [0, 1, -1, -1, 0, 1, 0],
            "n": [30, 10, 30, 10, 30, 10, 30],
            "curvature_mean": [1.0, 3.0, 1.0, 3.0, 2.0, 2.0, 9.0],
        }
    )
    values = checkpoint_values(cohorts, "curvature", "mean_curvature", 6, "test", [0, 1])
    assert values.to_numpy() == pytest.approx([(30 + 30) / 40, 2.0])


def test_a_nonfinite_metric_is_an_error_not_a_silent_nan():
    table = regression_table()
    table.loc[(table["index"] == 1) & (table["data_group"] == "all"), "r2"] = np.nan
    with pytest.raises(DataError, match=r"r2 is not finite at epoch 5, split test for indices \[1\]"):
        checkpoint_values(table, "regression", "r2", 5, "test", [0, 1])


def test_no_comparisons_give_empty_tables_with_their_columns():
    table, long = comparison_tables([], {})
    assert table.empty and list(table.columns) == list(TABLE_COLUMNS)
    assert long.empty and list(long.columns) == list(VALUE_COLUMNS)


def write_h5(path, train_labels, test_labels, holdout, test_images=None):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["train/images"] = rng.integers(0, 255, (len(train_labels), 1, 4, 4), dtype=np.uint8)
        f["train/labels"] = np.asarray(train_labels, np.int64)
        f["train/holdout"] = np.asarray(holdout, bool)
        images = rng.integers(0, 255, (len(test_labels), 1, 4, 4), dtype=np.uint8)
        f["test/images"] = images if test_images is None else test_images
        f["test/labels"] = np.asarray(test_labels, np.int64)
        f["test/text"] = np.array([f"t{i}" for i in range(len(test_labels))], dtype=object).astype(
            h5py.string_dtype()
        )
    return path


def test_corrupted_training_labels_keep_the_test_and_holdout_fingerprints(tmp_path):
    holdout = [True, True, False, False, False]
    clean = write_h5(tmp_path / "clean.h5", [0, 1, 0, 1, 0], [1, 0, 1], holdout)
    flipped = write_h5(tmp_path / "flipped.h5", [0, 1, 1, 0, 0], [1, 0, 1], holdout)  # outside the holdout
    other = write_h5(tmp_path / "other.h5", [0, 1, 0, 1, 0], [1, 1, 1], holdout)
    for split in ("test", "holdout"):
        assert split_fingerprint(clean, split) == split_fingerprint(flipped, split)
    assert split_fingerprint(clean, "test") != split_fingerprint(other, "test")
    assert split_fingerprint(clean, "holdout") == split_fingerprint(other, "holdout")
    check_same_samples("c", "test", {"clean": clean, "flipped": flipped})
    with pytest.raises(
        DataError, match=r"comparison c: the test samples of runs \['other'\] differ from those of clean"
    ):
        check_same_samples("c", "test", {"clean": clean, "flipped": flipped, "other": other})
    flipped_holdout = write_h5(tmp_path / "fh.h5", [1, 1, 0, 1, 0], [1, 0, 1], holdout)
    assert split_fingerprint(clean, "holdout") != split_fingerprint(flipped_holdout, "holdout")
    with pytest.raises(DataError, match="not a complete epochlens dataset.h5"):
        split_fingerprint(tmp_path / "missing.h5", "test")


def test_an_accuracys_interval_stays_within_0_and_1_and_says_where_it_was_cut():
    """Two seeds' accuracies 0.95 and 1.0: the Student-t interval is 0.975 ± 0.318 (t = 12.7), which
    an accuracy cannot reach; the table's interval ends at 1 (and the difference's at ±1) and its
    note says so. An unbounded metric's interval is scipy's, as it was."""
    values = {"a": pd.Series([0.95, 1.0]), "b": pd.Series([0.2, 0.9])}
    table = compare_runs(values, {"a": 3, "b": 3}, metric="accuracy")
    assert table["ci95_high"].max() == 1.0 and table["ci95_low"].min() == 0.0
    assert table.loc[1, "difference_ci95_low"] >= -1.0 and table.loc[1, "difference_ci95_high"] <= 1.0
    assert "the run's Student-t 95% interval cut to the metric's range [0, 1]" in table.loc[0, "note"]
    assert "the difference's Welch 95% interval cut to the metric's range [-1, 1]" in table.loc[1, "note"]
    r2 = compare_runs(
        {"a": pd.Series([0.95, 1.0]), "b": pd.Series([0.2, 0.9])}, {"a": 3, "b": 3}, metric="r2"
    )
    assert r2.loc[0, "ci95_high"] == 1.0 and r2.loc[0, "ci95_low"] == pytest.approx(0.975 - 0.3177, abs=1e-3)
    free = compare_runs(values, {"a": 3, "b": 3})
    low, high = scipy.stats.t.interval(0.95, 1, loc=0.975, scale=scipy.stats.sem([0.95, 1.0]))
    assert (free.loc[0, "ci95_low"], free.loc[0, "ci95_high"]) == (pytest.approx(low), pytest.approx(high))
