"""Probes of a regression: the closed-form ridge probe against scikit-learn, target-quantile bins,
the tables' metric column (a classifier's columns unchanged), the heatmap and float targets in
features files. The config's side: test_probe_config.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from quality import above, below
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from epochlens.errors import ConfigError, ProbeError
from epochlens.plotting.probes import plot_probe_accuracy
from epochlens.probes.linear import probe_checkpoint, probe_features
from epochlens.probes.ridge import eigen_path, fit_ridge_path, random_split, ridge_seeds, solve_path
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.summary import probe_summary
from epochlens.probes.targets import (
    quantile_edges,
    quantile_target,
    select_regression_targets,
    select_targets,
    target_scalar,
)

FAST = ProbeSettings(seeds=(0, 1, 2), max_epochs=40, patience=5, lr=0.05, batch_size=128)
#: The columns of a classifier's per-epoch probe table before the metric column existed.
CLASSIFIER_ROW_COLUMNS = [
    "run",
    "index",
    "epoch",
    "layer",
    "representation",
    "target",
    "seed",
    "eval_split",
    "n_features",
    "n_classes",
    "n_fit",
    "n_stop",
    "n_eval",
    "accuracy",
    "loss",
    "chance",
    "fit_accuracy",
    "best_epoch",
    "epochs_run",
    "status",
]


def standardised(x: np.ndarray) -> np.ndarray:
    scale = x.std(0)
    return (x - x.mean(0)) / np.where(scale > 0, scale, 1.0)


def linear_problem(rng, n: int, d: int, k: int, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((n, d)) * rng.uniform(0.5, 3, d) + rng.standard_normal(d)
    w = rng.standard_normal((d, k))
    return x.astype(np.float32), (x @ w + 2.0 + noise * rng.standard_normal((n, k))).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# The ridge probe


@pytest.mark.parametrize(("n", "d", "k"), [(60, 5, 3), (12, 30, 2), (40, 4, 1)])  # primal, dual, scalar
def test_ridge_path_equals_scikit_learn_ridge(rng, n, d, k) -> None:
    """Same penalty (alpha per fit sample: Ridge(alpha=alpha * n)) -> same coefficients, intercept,
    predictions and R² within 1e-6, for more samples than features and fewer."""
    x, y = linear_problem(rng, n, d, k)
    y = y[:, 0] if k == 1 else y
    x_new = rng.standard_normal((25, d)).astype(np.float32)
    alphas = (1e-4, 1e-2, 1.0)
    for fit in fit_ridge_path(x, y, alphas):
        ref = Ridge(alpha=fit.alpha * n, fit_intercept=True, solver="svd").fit(
            standardised(x.astype(np.float64)), y.astype(np.float64)
        )
        coef = ref.coef_.T.reshape(d, -1)
        np.testing.assert_allclose(fit.coef, coef, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(fit.intercept, np.atleast_1d(ref.intercept_), rtol=1e-6, atol=1e-8)
        mean, scale = x.astype(np.float64).mean(0), x.astype(np.float64).std(0)
        expected = ref.predict((x_new - mean) / scale).reshape(len(x_new), -1)
        np.testing.assert_allclose(fit.predict(x_new), expected, rtol=1e-6, atol=1e-8)
        y_new = expected + rng.standard_normal(expected.shape)
        assert r2_score(y_new, fit.predict(x_new)) == pytest.approx(r2_score(y_new, expected), abs=1e-6)


def test_ridge_probe_keeps_the_penalty_with_the_best_validation_r2_and_scores_it(rng) -> None:
    """Each seed: the penalty of the best R² (scikit-learn's) on its held-out fit samples; rows'
    R² and MSE those of scikit-learn's Ridge with that penalty fitted on the other fit samples."""
    x, y = linear_problem(rng, 200, 12, 4, noise=2.0)
    x[:, 6:] = rng.standard_normal((200, 6))  # features with nothing to say: some penalty helps
    holdout, test = np.arange(200) < 40, np.arange(200) >= 170
    fit = ~holdout & ~test
    settings = ProbeSettings(seeds=(0, 1), stop_fraction=0.25, ridge_alphas=(1e-4, 1e-2, 0.1, 1.0, 10.0))
    rows = ridge_seeds(x, y, fit, {"holdout": holdout, "test": test}, settings)
    assert [(r["seed"], r["eval_split"]) for r in rows] == [
        (0, "holdout"),
        (0, "test"),
        (1, "holdout"),
        (1, "test"),
    ]
    fit_pos = np.flatnonzero(fit)
    xs64, y64 = x.astype(np.float64), y.astype(np.float64)
    for row in rows:
        assert row["metric"] == "r2" and "accuracy" not in row and row["n_outputs"] == 4
        keep, held = random_split(len(fit_pos), 0.25, row["seed"])
        keep, held = fit_pos[keep], fit_pos[held]
        assert (row["n_fit"], row["n_stop"]) == (len(keep), len(held)) == (98, 32)
        mean, scale = xs64[keep].mean(0), xs64[keep].std(0)

        def ridge(alpha, keep=keep, mean=mean, scale=scale):
            return Ridge(alpha=alpha * len(keep)).fit((xs64[keep] - mean) / scale, y64[keep])

        scores = {
            a: r2_score(y64[held], ridge(a).predict((xs64[held] - mean) / scale))
            for a in settings.ridge_alphas
        }
        assert row["alpha"] == max(scores, key=scores.get)
        ev = holdout if row["eval_split"] == "holdout" else test
        pred = ridge(row["alpha"]).predict((xs64[ev] - mean) / scale)
        assert row["r2"] == pytest.approx(r2_score(y64[ev], pred), abs=1e-6)
        assert row["loss"] == pytest.approx(np.mean((pred - y64[ev]) ** 2), rel=1e-6)
        # chance: R² of the mean target of all fit samples, the same for every seed
        const = np.broadcast_to(y64[fit].mean(0), y64[ev].shape)
        assert row["chance"] == pytest.approx(r2_score(y64[ev], const), abs=1e-9) and row["chance"] <= 0.01


@pytest.mark.quality
def test_ridge_probe_of_informative_and_useless_features(rng) -> None:
    x, y = linear_problem(rng, 300, 8, 3, noise=0.01)
    holdout = np.arange(300) < 60
    good = ridge_seeds(x, y, ~holdout, {"holdout": holdout}, ProbeSettings(seeds=(0,)))
    noise = rng.standard_normal((300, 8)).astype(np.float32)
    bad = ridge_seeds(noise, y, ~holdout, {"holdout": holdout}, ProbeSettings(seeds=(0,)))
    above("informative features: holdout R²", good[0]["r2"], 0.999)
    above("informative features: fit R²", good[0]["fit_r2"], 0.999)
    below("noise features: holdout R²", bad[0]["r2"], 0.1)


def test_ridge_probe_refusals(rng) -> None:
    x, y = linear_problem(rng, 20, 3, 2)
    with pytest.raises(ProbeError, match="stop_fraction"):
        ridge_seeds(x, y, np.ones(20, bool), {}, ProbeSettings(stop_fraction=0.0))
    one = ridge_seeds(
        x,
        y,
        np.arange(20) >= 5,
        {"h": np.arange(20) < 5},
        ProbeSettings(stop_fraction=0.0, ridge_alphas=(0.1,)),
    )
    assert {r["n_stop"] for r in one} == {0} and {r["alpha"] for r in one} == {0.1}
    y_nan = y.copy()
    y_nan[1:] = np.nan  # undefined rows are left out: one fit sample left
    with pytest.raises(ProbeError, match="at least two"):
        ridge_seeds(x, y_nan, np.ones(20, bool), {}, ProbeSettings())
    with pytest.raises(ConfigError, match="ridge_alphas"):
        ProbeSettings(ridge_alphas=(0.1, -1.0))


# ---------------------------------------------------------------------------------------------
# Targets


def test_target_quantile_bins_come_from_the_fit_samples() -> None:
    vectors = np.array([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [0.0, 2.0]])
    np.testing.assert_allclose(target_scalar(vectors), [5.0, 1.0, 10.0, 2.0])  # L2 norm per sample
    np.testing.assert_allclose(target_scalar(np.array([[1.5], [-2.0]])), [1.5, -2.0])  # (N, 1): the value
    train = np.array([1.0, 2.0, 3.0, 4.0, 100.0, 200.0])
    fit = np.array([True, True, True, True, False, False])  # the holdout's extremes set no edge
    edges = quantile_edges(train, 2, fit)
    np.testing.assert_allclose(edges, [2.5])
    np.testing.assert_array_equal(quantile_target(train, 2, edges=edges), [0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(quantile_target(np.array([0.0, 2.6, np.nan]), 2, edges=edges), [0, 1, -1])


def test_select_regression_targets(rng) -> None:
    train = rng.standard_normal((40, 3)).astype(np.float32)
    test = rng.standard_normal((10, 3)).astype(np.float32)
    fit = np.arange(40) >= 8
    curvature = rng.uniform(size=40)
    wanted = ["target", "target_quantile", "curvature"]
    targets, skipped = select_regression_targets({"train": train, "test": test}, wanted, curvature, 4, 5, fit)
    assert set(targets) == {"target", "target_q5", "curvature_q4"} and not skipped
    np.testing.assert_array_equal(targets["target"]["test"], test.astype(np.float64))
    edges = quantile_edges(np.linalg.norm(train, axis=1), 5, fit)
    np.testing.assert_array_equal(
        targets["target_q5"]["test"], quantile_target(np.linalg.norm(test, axis=1), 5, edges=edges)
    )
    assert np.bincount(targets["target_q5"]["train"][fit]).tolist() == [7, 6, 6, 6, 7]  # equal shares of fit
    assert set(targets["curvature_q4"]) == {"train"}
    _, skipped = select_regression_targets({"train": train, "test": test}, wanted, None, 4, 4, fit)
    assert skipped == {"curvature_q4": "skipped: curvature not computed at this epoch"}
    with pytest.raises(ProbeError, match="not a regression's"):
        select_regression_targets({"train": train}, ["class"], None, 4, 4, fit)
    with pytest.raises(ProbeError, match="float targets"):
        select_regression_targets({"train": np.arange(40)}, ["target"], None, 4, 4, fit)
    with pytest.raises(ProbeError, match="not a classifier's"):
        select_targets(
            {"train": np.arange(40) % 2}, np.array([0, 1]), np.array([1]), ["target"], None, 4, fit
        )


# ---------------------------------------------------------------------------------------------
# Tables and figure


class FakeFeatures:
    """The part of FeatureSet that probe_features and probe_checkpoint read."""

    def __init__(self, arrays: dict[tuple[str, str, str], np.ndarray]) -> None:
        self.arrays = arrays
        self.layers = sorted({k[1] for k in arrays})
        self.representations = sorted({k[2] for k in arrays})
        self.splits = ["train", "test"]

    def array(self, split: str, layer: str, representation: str) -> np.ndarray:
        return self.arrays[(split, layer, representation)]


def regression_features(rng) -> tuple[FakeFeatures, dict, np.ndarray, np.ndarray]:
    x, y = linear_problem(rng, 150, 6, 3, noise=0.05)
    noise = rng.standard_normal((150, 6)).astype(np.float32)
    arrays = {
        ("train", "body", "pooled"): x[:120],
        ("test", "body", "pooled"): x[120:],
        ("train", "body", "stats"): noise[:120],
        ("test", "body", "stats"): noise[120:],
    }
    holdout = np.arange(120) < 30
    targets, skipped = select_regression_targets(
        {"train": y[:120], "test": y[120:]}, ["target", "target_quantile", "curvature"], None, 4, 2, ~holdout
    )
    return FakeFeatures(arrays), targets, skipped, holdout


@pytest.mark.quality
def test_probe_tables_of_a_regression_name_the_metric(rng) -> None:
    features, targets, skipped, holdout = regression_features(rng)
    context = {"run": "inverse", "index": 0, "epoch": 5}
    table = probe_checkpoint(features, targets, skipped, holdout, FAST, context, device="cpu")
    assert list(table.columns) == [*CLASSIFIER_ROW_COLUMNS, "metric", "n_outputs", "r2", "fit_r2", "alpha"]
    ridge = table[table.target == "target"]
    assert (ridge.metric == "r2").all() and ridge.accuracy.isna().all() and ridge.fit_accuracy.isna().all()
    assert ridge.r2.notna().all() and (ridge.n_outputs == 3).all() and ridge.n_classes.isna().all()
    bins = table[table.target == "target_q2"]
    assert (bins.metric == "accuracy").all() and bins.r2.isna().all() and (bins.n_classes == 2).all()
    assert (
        table[table.target == "curvature_q4"].status == "skipped: curvature not computed at this epoch"
    ).all()
    assert (table[table.target == "curvature_q4"].metric == "accuracy").all()

    # Two indices: the run's table keeps R² and accuracy apart.
    per_seed = pd.concat([table, table.assign(index=1)], ignore_index=True)
    summary = probe_summary(per_seed)
    assert "r2_mean" in summary and "r2_ci95" in summary and "alpha_mean" in summary
    r2_rows = summary[summary.metric == "r2"]
    assert len(r2_rows) == 4 and r2_rows.accuracy_mean.isna().all() and (r2_rows.n_indices == 2).all()
    assert (r2_rows.n_seeds == 3).all() and (r2_rows.n_outputs == 3).all()
    good = r2_rows[(r2_rows.representation == "pooled") & (r2_rows.eval_split == "test")].iloc[0]
    seeds = ridge[(ridge.representation == "pooled") & (ridge.eval_split == "test")]
    assert good.r2_mean == pytest.approx(seeds.r2.mean())
    above("pooled features: mean test R²", good.r2_mean, 0.99)
    assert good.chance == pytest.approx(seeds.chance.iloc[0]) and good.r2_index_std == 0
    acc_rows = summary[(summary.metric == "accuracy") & (summary.status == "ok")]
    assert acc_rows.r2_mean.isna().all() and acc_rows.accuracy_mean.notna().all()
    assert (summary[summary.status != "ok"].target == "curvature_q4").all()

    fig = plot_probe_accuracy(summary, "inverse")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0] == "regression target (ridge probe)\nholdout R²"  # R² panels first
    assert any(t.endswith("holdout accuracy") for t in titles)
    labels = {ax.get_ylabel() for ax in fig.axes}
    assert {"holdout R²", "holdout accuracy"} <= labels  # one colour bar per metric


def test_a_classifiers_tables_keep_their_columns(rng) -> None:
    """Existing users' tables: the same columns in the same order, ``metric`` added at the end."""
    y = np.arange(150) % 2
    x = (rng.standard_normal((150, 4)) + 3 * y[:, None]).astype(np.float32)
    features = FakeFeatures({("train", "b1", "pooled"): x[:120], ("test", "b1", "pooled"): x[120:]})
    targets = {"class": {"train": y[:120], "test": y[120:]}}
    table = probe_checkpoint(
        features,
        targets,
        {"cohort": "skipped: no old classes yet (first task)"},
        np.arange(120) < 30,
        FAST,
        {"run": "digits", "index": 0, "epoch": 2},
        device="cpu",
    )
    assert list(table.columns) == [*CLASSIFIER_ROW_COLUMNS, "metric"]
    assert set(table.metric) == {"accuracy"}
    summary = probe_summary(table)
    spreads = ("mean", "seed_std", "index_std", "ci95")
    old = [
        "run",
        "epoch",
        "layer",
        "representation",
        "target",
        "eval_split",
        "status",
        "n_features",
        "n_classes",
    ]
    old += ["n_indices", "n_seeds", "n_eval", "chance"]
    old += [f"{m}_{s}" for m in ("accuracy", "loss", "fit_accuracy", "best_epoch") for s in spreads]
    assert list(summary.columns) == [*old, "metric"]
    # A table written before the metric column: read as accuracies, the figure as before.
    legacy = probe_summary(table.drop(columns="metric"))
    pd.testing.assert_frame_equal(legacy, summary)
    fig = plot_probe_accuracy(summary.drop(columns="metric"), "digits")
    assert "linear-probe accuracy" in fig._suptitle.get_text()


# ---------------------------------------------------------------------------------------------
# Features files


def test_features_files_keep_a_regressions_float_targets(tmp_path, rng) -> None:
    from epochlens.data import Dataset
    from epochlens.features.cache import FeatureSet, write_features
    from epochlens.features.settings import FeatureSettings, RepresentationSettings

    x, y = linear_problem(rng, 50, 9, 9)
    data = Dataset(
        "inverse", "npz", x[:40], y[:40], x[40:], y[40:], 0, 1.0, (0.0,), (1.0,), kind="regression"
    )
    model = torch.nn.Sequential(torch.nn.Linear(9, 4), torch.nn.Tanh(), torch.nn.Linear(4, 9))
    settings = FeatureSettings(layers=["1"], representations=RepresentationSettings(names=("pooled",)))
    write_features(tmp_path / "f.h5", model, data, "0" * 64, settings, device="cpu")
    features = FeatureSet(tmp_path / "f.h5")
    for split, expected in (("train", y[:40]), ("test", y[40:])):
        got = features.labels(split)
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    # and probes run on them: the ridge probe of the stored targets
    targets, _ = select_regression_targets(
        {s: features.labels(s) for s in ("train", "test")}, ["target"], None, 4, 4, np.arange(40) >= 10
    )
    table = probe_features(features, targets, np.arange(40) < 10, ProbeSettings(seeds=(0,)), device="cpu")
    assert set(table.metric) == {"r2"} and table.r2.notna().all()


@pytest.mark.parametrize(("n", "d"), [(300, 40), (20, 40)])
def test_solve_path_equals_an_explicit_solve_for_every_penalty(rng, n, d) -> None:
    """The tridiagonal solve of (A + n alpha I) W = B, A = X'X (full rank, and rank 20 < 40), equals
    numpy's solve of each penalty's system in float64, and float32 stays within 1e-3 of it
    where the system is not ill-conditioned (penalties 1 and 50)."""
    x = rng.standard_normal((n, d)) @ rng.standard_normal((d, d))
    a, b = x.T @ x, rng.standard_normal((d, 3))
    alphas = (1e-6, 1e-3, 1.0, 50.0)
    for alpha, w in zip(alphas, solve_path(a, b, n, alphas), strict=True):
        exact = np.linalg.solve(a + n * alpha * np.eye(d), b)
        np.testing.assert_allclose(w, exact, rtol=1e-5, atol=1e-9 * np.abs(exact).max())  # cond. up to 1e9
    for alpha, w in zip(
        alphas[2:], solve_path(a.astype(np.float32), b.astype(np.float32), n, alphas[2:]), strict=True
    ):
        exact = np.linalg.solve(a + n * alpha * np.eye(d), b)
        assert w.dtype == np.float32
        assert np.abs(w - exact).max() <= 1e-3 * np.abs(exact).max()


def test_solve_path_of_a_matrix_negative_by_rounding_takes_the_eigen_path(rng) -> None:
    """An eigenvalue below -n alpha (rounding of a downdated Gram) makes a system indefinite: every
    penalty is then solved by the eigen path, which counts that eigenvalue as 0."""
    vecs = np.linalg.qr(rng.standard_normal((8, 8)))[0]
    evals = np.array([-1e-3, 1e-2, 0.5, 1, 2, 3, 4, 5])
    a, b = (vecs * evals) @ vecs.T, rng.standard_normal((8, 2))
    alphas = (1e-6, 1.0)
    got = solve_path(a, b, 1, alphas)
    want = eigen_path(*np.linalg.eigh(a), b, 1, alphas)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10)
    assert np.abs(got[0]).max() > 1e3  # the clipped eigenvalue: 1 / (0 + 1e-6), not 1 / (-1e-3 + 1e-6)
