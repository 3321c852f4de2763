"""Softmax probes on shared mini-batches (probes.batch_order: shared): one seed is the per-seed
algorithm exactly, several reach per_seed's accuracies, a seed never learns from rows outside its
fit set, and the setting is checked and rerun-relevant."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from quality import above, below
from test_probe_config import classifier_run, validate
from test_probes import FakeFeatures

from epochlens import config as run_config
from epochlens.errors import ConfigError
from epochlens.probes.batched import SeedSplit, batched_rows
from epochlens.probes.linear import probe_features
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.shared_order import _Rows, fit_stats, train_shared
from epochlens.probes.softmax import probe_seeds

SETTINGS = ProbeSettings(seeds=(0, 3, 7), max_epochs=40, patience=5, batch_size=64)
SHARED = replace(SETTINGS, batch_order="shared")


def layers_problem(rng, n: int = 900, d: int = 12, k: int = 3, signals=(0.0, 0.4, 1.5)):
    """(G, N, D) features of ``k`` classes whose centres grow with each layer's signal (offset
    3: the standardisation matters), labels (N,), and a fit mask of the first three quarters."""
    y = rng.integers(0, k, n)
    centres = rng.normal(size=(k, d))
    x = np.stack([(s * centres[y] + rng.normal(size=(n, d)) + 3).astype(np.float32) for s in signals])
    fit = np.arange(n) < 3 * n // 4
    return x, y, fit, {"holdout": ~fit, "fit": fit}


def test_one_seed_on_shared_batches_is_the_per_seed_probe(rng) -> None:
    """With one seed the union of fit rows is its own and the permutation its own generator's:
    the shared algorithm is then per_seed's step for step (same accuracies, losses, epochs)."""
    x, y, fit, evals = layers_problem(rng)
    one = replace(SETTINGS, seeds=(5,))
    shared = batched_rows(torch.as_tensor(x), y, fit, evals, replace(one, batch_order="shared"))
    for layer in range(len(x)):
        alone = probe_seeds(torch.as_tensor(x[layer]), y, fit, evals, one, "cpu")
        assert len(alone) == len(shared[layer]) == 2
        for a, b in zip(alone, shared[layer], strict=True):
            assert (a["seed"], a["eval_split"], a["n_fit"], a["n_stop"]) == (
                b["seed"], b["eval_split"], b["n_fit"], b["n_stop"])  # fmt: skip
            assert abs(a["accuracy"] - b["accuracy"]) < 1e-4 and abs(a["loss"] - b["loss"]) < 1e-3
            assert (a["best_epoch"], a["epochs_run"]) == (b["best_epoch"], b["epochs_run"])


@pytest.mark.quality
def test_shared_batches_reach_the_per_seed_accuracies(rng) -> None:
    """Several seeds on shared batches: not the same steps as per_seed (other batches), but the
    same accuracies within 0.01 on average over (layer, seed, evaluation set), close row by row."""
    x, y, fit, evals = layers_problem(rng, n=1600)
    per_seed = batched_rows(torch.as_tensor(x), y, fit, evals, SETTINGS)
    shared = batched_rows(torch.as_tensor(x), y, fit, evals, SHARED)
    diffs, changed = [], False
    for a_rows, b_rows in zip(per_seed, shared, strict=True):
        for a, b in zip(a_rows, b_rows, strict=True):
            assert (a["seed"], a["eval_split"], a["n_fit"], a["n_stop"]) == (
                b["seed"], b["eval_split"], b["n_fit"], b["n_stop"])  # fmt: skip
            diffs.append(b["accuracy"] - a["accuracy"])
            changed |= a["loss"] != b["loss"]
    assert changed  # other batches: other probes
    below("|mean accuracy difference|, shared - per seed", abs(np.mean(diffs)), 0.01)
    below("largest |accuracy difference|, shared - per seed", np.max(np.abs(diffs)), 0.12)
    above("the signal layer's accuracy", shared[2][0]["accuracy"], 0.9)  # signal vs none
    below("the noise layer's accuracy", shared[0][0]["accuracy"], 0.9)
    assert min(r["epochs_run"] for rows in shared for r in rows) < SHARED.max_epochs  # stopped early


def test_rows_outside_a_seeds_fit_set_never_move_its_weights(rng) -> None:
    """Seed 0 fits 60 rows and stops on 30 others; seed 1 fits 30 of seed 0's fit rows, seed 0's
    30 early-stopping rows and 210 rows of its own. Garbage features and labels on those 210
    (a fifth of each batch of 16 is seed 0's: some batches hold none) change seed 1's probes and
    leave seed 0's weights, standardisation, best epoch and stopping epoch as they were (to float32
    rounding: the features are centred on the union's mean before each seed's sums)."""
    g, n, d, k = 2, 400, 6, 3
    y = torch.as_tensor(rng.integers(0, k, n))
    signal = 0.8 * np.eye(k, d)[y.numpy()]
    x = torch.as_tensor((rng.normal(size=(g, n, d)) + signal + 2).astype(np.float32))
    perm = torch.as_tensor(rng.permutation(n))
    own, stop0, others, rest = perm[:60], perm[60:90], perm[90:300], perm[300:]
    splits = [
        SeedSplit(own.sort().values, stop0.sort().values),
        SeedSplit(torch.cat([own[:30], stop0, others]).sort().values, rest.sort().values),
    ]
    settings = ProbeSettings(seeds=(0, 1), max_epochs=12, patience=20, batch_size=16)
    garbage_x, garbage_y = x.clone(), y.clone()
    garbage_x[:, others] = 25 * torch.randn(g, len(others), d) - 40
    garbage_y[others] = (garbage_y[others] + 1) % k
    a = train_shared(x, y, splits, settings.seeds, k, settings)
    b = train_shared(garbage_x, garbage_y, splits, settings.seeds, k, settings)
    close = {"rtol": 1e-4, "atol": 1e-5}
    for p in (0, 2):  # (layer 0, seed 0), (layer 1, seed 0): probes are layer-major
        for field in ("weight", "bias", "mean", "scale"):
            torch.testing.assert_close(getattr(a, field)[p], getattr(b, field)[p], **close)
        assert (a.best_epoch[p], a.epochs_run[p]) == (b.best_epoch[p], b.epochs_run[p])
    assert a.best_epoch[0] > 0 and a.weight[0].abs().max() > 0.1  # seed 0 learned something
    for p in (1, 3):  # seed 1 learned from the garbage: far from its probes without it
        assert (a.weight[p] - b.weight[p]).abs().max() > 0.05 and (a.mean[p] - b.mean[p]).abs().max() > 1


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_each_seed_is_standardised_by_its_own_fit_rows(rng, offset) -> None:
    """Each (layer, seed)'s mean and population std are those of its fit rows alone (float64
    two-pass, NumPy), also where a seed's rows lie far from the others' (offset: float64 sums)."""
    x = rng.normal(size=(2, 300, 5)) * [1.0, 3.0, 0.01, 1.0, 1.0] + 4.0
    x[:, 200:] += offset  # rows only seed 1 fits
    x[:, :, 3] = 2.5  # a constant feature: scale 1
    fits = [np.arange(0, 150), np.arange(50, 300)]
    splits = [SeedSplit(torch.as_tensor(f), torch.as_tensor(f)) for f in fits]
    mean, scale = fit_stats(torch.as_tensor(x, dtype=torch.float32), _Rows.of(splits), True)
    assert mean.shape == scale.shape == (2, 2, 1, 5)
    for layer in range(2):
        for seed, f in enumerate(fits):
            std = x[layer, f].std(0)
            np.testing.assert_allclose(
                mean[layer, seed, 0], x[layer, f].mean(0), rtol=1e-6, atol=1e-5 * std.max()
            )
            np.testing.assert_allclose(scale[layer, seed, 0], np.where(std > 1e-9, std, 1.0), rtol=1e-5)


def test_batch_order_is_checked_and_a_param_only_where_shared() -> None:
    with pytest.raises(ConfigError, match=r"batch_order='random' must be one of \['per_seed', 'shared'\]"):
        ProbeSettings(batch_order="random")
    with pytest.raises(ConfigError, match="batch_order"):
        validate(classifier_run(probes={"batch_order": "random"}))
    shared = run_config.probe_params(validate(classifier_run(probes={"batch_order": "shared"})))
    assert shared["settings"]["batch_order"] == "shared"
    assert ProbeSettings(**shared["settings"]).batch_order == "shared"
    default = run_config.probe_params(validate(classifier_run()))
    assert default == run_config.probe_params(validate(classifier_run(probes={"batch_order": "per_seed"})))
    assert "batch_order" not in default["settings"]
    ridge = classifier_run(probes={"kind": "ridge", "batch_order": "shared"})
    assert "batch_order" not in run_config.probe_params(validate(ridge))["settings"]  # no softmax probe


@pytest.mark.quality
def test_probe_table_of_shared_batches_keeps_its_columns(rng) -> None:
    """probe_features with batch_order shared: the per_seed table's columns and rows (layers,
    representations of two widths, seeds, evaluation sets), close accuracies, and the same table
    whether the layers are fitted together or one at a time (batch_layers is an execution setting)."""
    x, y, fit, _ = layers_problem(rng, n=480, signals=(0.5, 1.0, 2.0))
    arrays = {}
    for layer, name in enumerate("abc"):
        for split, rows in (("train", slice(0, 400)), ("test", slice(400, None))):
            arrays[(split, name, "pooled")] = x[layer, rows]
            arrays[(split, name, "stats")] = x[layer, rows, :4]
    feats = FakeFeatures(arrays)
    targets = {"class": {"train": y[:400], "test": y[400:]}}
    holdout = np.arange(400) < 80
    base = ProbeSettings(seeds=(0, 1), max_epochs=30, patience=5, batch_size=64)
    per_seed = probe_features(feats, targets, holdout, base, device="cpu")
    tables = [
        probe_features(
            feats, targets, holdout, replace(base, batch_order="shared", batch_layers=b), device="cpu"
        )
        for b in (1, 16)
    ]
    scores = ["accuracy", "loss", "fit_accuracy", "best_epoch", "epochs_run"]
    assert list(tables[1].columns) == list(per_seed.columns)
    pd.testing.assert_frame_equal(tables[1].drop(columns=scores), per_seed.drop(columns=scores))
    below(
        "|mean accuracy difference|, shared - per seed",
        abs((tables[1]["accuracy"] - per_seed["accuracy"]).mean()),
        0.02,
    )
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=False, rtol=1e-4, atol=1e-5)
    assert len(tables[1]) == 3 * 2 * 2 * 2  # layers x representations x seeds x evaluation sets
