"""The closed-form ridge probe of class targets (probes.kind: ridge) against scikit-learn's
RidgeClassifier, stacked layers against one at a time, bad features and the config key."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.linear_model import RidgeClassifier
from sklearn.preprocessing import StandardScaler
from test_probe_config import classifier_run, validate
from test_probes import FakeFeatures

from epochlens import config as run_config
from epochlens.errors import ConfigError, ProbeError
from epochlens.probes import ridge_classes
from epochlens.probes.linear import probe_checkpoint, probe_plan
from epochlens.probes.ridge_classes import class_ridge_rows, fit_class_ridge, pm_targets
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.summary import probe_summary

ALPHAS = (1e-4, 1e-2, 1.0, 100.0)
RIDGE = ProbeSettings(seeds=(0, 1, 2), kind="ridge", ridge_alphas=ALPHAS)


def class_problem(rng, g: int, n: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Features (g, n, d) of k noisy classes, offsets and scales per feature, feature 2 constant."""
    y = rng.integers(0, k, n)
    centres = rng.standard_normal((g, k, d))
    x = centres[:, y] + 1.5 * rng.standard_normal((g, n, d))
    x = x * rng.uniform(0.2, 5, d) + rng.uniform(-20, 20, d)
    x[:, :, 2] = 3.0
    return x, y


def splits(n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    pos = np.arange(n)
    return pos < int(0.75 * n), {"holdout": pos >= int(0.75 * n)}


def sklearn_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[StandardScaler, RidgeClassifier]:
    scaler = StandardScaler().fit(x)
    return scaler, RidgeClassifier(alpha=alpha * len(x), solver="svd").fit(scaler.transform(x), y)


@pytest.mark.parametrize(("n", "d", "k"), [(240, 6, 2), (240, 10, 4), (60, 40, 3)])
def test_every_seed_and_penalty_equals_scikit_learns_ridge_classifier(rng, n, d, k) -> None:
    x, y = class_problem(rng, 2, n, d, k)
    fit_mask, evals = splits(n)
    plan = probe_plan(y, fit_mask, evals, RIDGE, torch.device("cpu"))
    fit = fit_class_ridge(
        torch.as_tensor(x), pm_targets(torch.as_tensor(y), k, torch.float64), plan.seed_rows, ALPHAS
    )
    ev = plan.eval_sets["holdout"].numpy()
    for s, (rows, _) in enumerate(plan.seed_rows):
        rows = rows.numpy()
        for a, alpha in enumerate(ALPHAS):
            coef = fit.coef[a][:, s].numpy()  # (G, D, K)
            for g in range(len(x)):
                scaler, ref = sklearn_fit(x[g, rows], y[rows], alpha)
                # two classes: scikit-learn keeps the second class's column; ours are it and its negative
                ours = coef[g][:, 1] if k == 2 else coef[g]
                np.testing.assert_allclose(ours, ref.coef_.T.squeeze(), rtol=1e-6, atol=1e-9)
                intercept = fit.intercept[s].numpy()
                np.testing.assert_allclose(intercept[1:] if k == 2 else intercept, ref.intercept_, rtol=1e-9)
                assert np.abs(coef[g][2]).max() < 1e-9  # the constant feature: scale 1, coefficient 0
                out = fit.outputs(torch.as_tensor(x[:, ev]), s, fit.coef[a][:, s])[g].numpy()
                np.testing.assert_allclose(
                    out[:, 1] if k == 2 else out, ref.decision_function(scaler.transform(x[g, ev])), atol=1e-8
                )
                assert np.array_equal(out.argmax(1), ref.predict(scaler.transform(x[g, ev])))


def test_rows_keep_the_penalty_of_best_held_out_accuracy_and_score_it(rng) -> None:
    x, y = class_problem(rng, 1, 300, 30, 3)
    fit_mask, evals = splits(300)
    rows = class_ridge_rows(torch.as_tensor(x), y, fit_mask, evals, RIDGE)[0]
    plan = probe_plan(y, fit_mask, evals, RIDGE, torch.device("cpu"))
    ev = evals["holdout"]
    for row, (fit_rows, held) in zip(rows, plan.seed_rows, strict=True):
        fit_rows, held = fit_rows.numpy(), held.numpy()
        held_acc = []
        for alpha in ALPHAS:
            scaler, ref = sklearn_fit(x[0, fit_rows], y[fit_rows], alpha)
            held_acc.append(ref.score(scaler.transform(x[0, held]), y[held]))
        best = max(a for a, acc in zip(ALPHAS, held_acc, strict=True) if acc == max(held_acc))
        scaler, ref = sklearn_fit(x[0, fit_rows], y[fit_rows], best)
        assert row["alpha"] == best and row["n_fit"] == len(fit_rows) and row["n_stop"] == len(held)
        assert row["accuracy"] == pytest.approx(ref.score(scaler.transform(x[0, ev]), y[ev]), abs=1e-12)
        assert row["fit_accuracy"] == pytest.approx(ref.score(scaler.transform(x[0, fit_rows]), y[fit_rows]))
        coded = np.where(y[ev][:, None] == np.arange(3), 1.0, -1.0)  # loss: MSE of the ±1 targets
        mse = np.mean((ref.decision_function(scaler.transform(x[0, ev])) - coded) ** 2)
        assert row["loss"] == pytest.approx(mse, rel=1e-9)
        assert row["chance"] == pytest.approx(np.mean(y[ev] == np.bincount(y[fit_mask]).argmax()))


def test_stacked_layers_equal_one_at_a_time_in_chunks_and_in_float32(rng, monkeypatch) -> None:
    x, y = class_problem(rng, 5, 200, 8, 3)
    fit_mask, evals = splits(200)
    y[::17] = -1  # undefined targets: left out everywhere
    alone = [class_ridge_rows(torch.as_tensor(x[g : g + 1]), y, fit_mask, evals, RIDGE)[0] for g in range(5)]
    monkeypatch.setattr(ridge_classes, "GRAM_BYTES", 3 * 3 * 8 * 8 * 8 * 2)  # two layers per chunk
    together = class_ridge_rows(torch.as_tensor(x), y, fit_mask, evals, RIDGE)
    assert pd.DataFrame(sum(together, [])).equals(pd.DataFrame(sum(alone, [])))
    single = ProbeSettings(**(RIDGE.as_dict() | {"ridge_dtype": "float32"}))
    lower = class_ridge_rows(torch.as_tensor(x, dtype=torch.float32), y, fit_mask, evals, single)
    diff = [abs(a["accuracy"] - b["accuracy"]) for ra, rb in zip(lower, alone, strict=True)
            for a, b in zip(ra, rb, strict=True)]  # fmt: skip
    assert max(diff) <= 0.01


def test_nan_features_are_refused_naming_the_layer_and_a_constant_layer_predicts_the_majority(rng) -> None:
    x, y = class_problem(rng, 2, 120, 5, 3)
    fit_mask, evals = splits(120)
    x[1, 7, 3] = np.nan
    with pytest.raises(ProbeError, match=r"layer\(s\) \['block2 \(mean\)'\] hold NaN"):
        class_ridge_rows(torch.as_tensor(x), y, fit_mask, evals, RIDGE, ["block1 (mean)", "block2 (mean)"])
    x[:] = 1.0  # no information: every output is the intercept, the fit set's most frequent class
    rows = class_ridge_rows(torch.as_tensor(x), y, fit_mask, evals, RIDGE)[0]
    assert all(r["accuracy"] == pytest.approx(r["chance"]) for r in rows)
    with pytest.raises(ProbeError, match="stop_fraction 0 leaves no samples"):
        class_ridge_rows(torch.as_tensor(x), y, fit_mask, evals, ProbeSettings(kind="ridge", stop_fraction=0))
    with pytest.raises(ProbeError, match="holds out 0 fit sample"):  # 0.001 of ~30 per class: none
        class_ridge_rows(
            torch.as_tensor(x), y, fit_mask, evals, ProbeSettings(kind="ridge", stop_fraction=1e-3)
        )


def test_probe_tables_of_ridge_probes_read_as_softmax_tables(rng) -> None:
    x, y = class_problem(rng, 3, 200, 6, 3)
    layers = ["a", "b", "c"]
    features = FakeFeatures(
        {(split, layer, "mean"): x[i, rows] for i, layer in enumerate(layers)
         for split, rows in (("train", slice(0, 160)), ("test", slice(160, None)))}
    )  # fmt: skip
    holdout = np.arange(160) >= 120
    targets = {"class": {"train": y[:160], "test": y[160:]}}
    table = probe_checkpoint(features, targets, {}, holdout, RIDGE, {"epoch": 3}, device="cpu")
    assert (table["metric"] == "accuracy").all() and table["alpha"].isin(ALPHAS).all()
    assert table["best_epoch"].isna().all() and table["accuracy"].between(0.5, 1).all()
    summary = probe_summary(table.assign(run="r", index=0))
    assert len(summary) == 6 and set(summary["layer"]) == set(layers)  # layers x (holdout, test)
    assert summary["accuracy_mean"].notna().all() and summary["best_epoch_mean"].isna().all()


def test_the_kind_key_is_checked_and_part_of_the_params_only_where_set(tmp_path) -> None:
    with pytest.raises(ConfigError, match="kind='lasso' must be one of"):
        ProbeSettings(kind="lasso")
    with pytest.raises(ConfigError, match="ridge_dtype='float16' must be one of"):
        ProbeSettings(ridge_dtype="float16")
    with pytest.raises(ConfigError, match="probes.*kind|kind.*lasso"):
        validate(classifier_run(probes={"kind": "lasso"}))
    ridge = classifier_run(probes={"kind": "ridge", "ridge_alphas": [0.1]})
    params = run_config.probe_params(validate(ridge))
    assert params["settings"]["kind"] == "ridge" and params["settings"]["ridge_alphas"] == [0.1]
    assert ProbeSettings(**params["settings"]).kind == "ridge"
    assert "kind" not in run_config.probe_params(validate(classifier_run()))["settings"]
    with pytest.raises(ConfigError, match=r"ridge probe of classes \(kind: ridge\) no samples"):
        validate(classifier_run(probes={"kind": "ridge", "stop_fraction": 0}))


def test_tridiagonal_and_eigen_solves_give_the_same_probes(rng) -> None:
    """The CPU's tridiagonal solves and the GPU's batched eigendecomposition (run here on the CPU)
    give the same coefficients for every layer, seed and penalty (float64)."""
    x, y = class_problem(rng, 2, 200, 12, 3)
    fit_mask, evals = splits(200)
    plan = probe_plan(y, fit_mask, evals, RIDGE, torch.device("cpu"))
    t = pm_targets(torch.as_tensor(y), 3, torch.float64)
    captured = []

    def capture(grams, xtys, counts, alphas, tridiagonal=None):
        captured.append((grams, xtys, counts, alphas))
        return solve(grams, xtys, counts, alphas, tridiagonal)

    solve = ridge_classes._solve
    ridge_classes._solve = capture
    try:
        fit_class_ridge(torch.as_tensor(x), t, plan.seed_rows, ALPHAS)
    finally:
        ridge_classes._solve = solve
    grams, xtys, counts, alphas = captured[0]
    tri = solve(grams, xtys, counts, alphas, tridiagonal=True)
    eig = solve(grams, xtys, counts, alphas, tridiagonal=False)
    for a, b in zip(tri, eig, strict=True):
        assert a.shape == (2, 3, 12, 3)
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
