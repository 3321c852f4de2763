"""Unit tests of linear probes: known answers on synthetic features, targets and seed aggregation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib import pyplot as plt
from quality import above, at_least, below

from epochlens.errors import ConfigError, ProbeError
from epochlens.probes.linear import probe_features, stratified_split
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.softmax import probe_seeds, train_linear_probe
from epochlens.probes.summary import aggregate_seeds
from epochlens.probes.targets import cohort_target, quantile_target, standard_targets

FAST = ProbeSettings(seeds=(0, 1, 2), max_epochs=60, patience=5, lr=0.05, batch_size=128)


def separable(
    rng: np.random.Generator, n: int = 300, d: int = 10, k: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Features of k classes at well-separated centres (distance 8, unit noise): linearly separable."""
    y = np.arange(n) % k
    centres = 8 * rng.standard_normal((k, d)) / np.sqrt(2)
    return (centres[y] + rng.standard_normal((n, d))).astype(np.float32), y.astype(np.int64)


class FakeFeatures:
    """The part of FeatureSet that probe_features reads."""

    def __init__(self, arrays: dict[tuple[str, str, str], np.ndarray]) -> None:
        self.arrays = arrays
        self.layers = sorted({k[1] for k in arrays})
        self.representations = sorted({k[2] for k in arrays})
        self.splits = ["train", "test"]

    def array(self, split: str, layer: str, representation: str) -> np.ndarray:
        return self.arrays[(split, layer, representation)]


@pytest.mark.quality
def test_linearly_separable_features_are_probed_near_perfectly(rng) -> None:
    x, y = separable(rng)
    holdout = np.zeros(len(y), dtype=bool)
    holdout[:60] = True
    rows = probe_seeds(x, y, ~holdout, {"holdout": holdout}, FAST, device="cpu")
    assert len(rows) == 3 and {r["seed"] for r in rows} == {0, 1, 2}
    for r in rows:
        at_least(f"seed {r['seed']}: holdout accuracy", r["accuracy"], 0.98)
        at_least(f"seed {r['seed']}: fit accuracy", r["fit_accuracy"], 0.98)
        assert r["n_eval"] == 60 and r["n_fit"] + r["n_stop"] == 240 and r["n_classes"] == 3
        assert 1 <= r["best_epoch"] <= r["epochs_run"] <= FAST.max_epochs
        assert r["chance"] == pytest.approx(1 / 3)


@pytest.mark.quality
def test_random_labels_give_chance_accuracy(rng) -> None:
    x = rng.standard_normal((600, 8)).astype(np.float32)
    y = rng.integers(0, 2, 600)
    holdout = np.arange(600) < 200
    rows = probe_seeds(x, y, ~holdout, {"holdout": holdout}, FAST, device="cpu")
    for r in rows:
        # 200 samples at chance: sd 0.035; 0.12 is 3.4 sd (p < 0.001)
        below(f"seed {r['seed']}: |accuracy - 0.5|", abs(r["accuracy"] - 0.5), 0.12)
        assert r["best_epoch"] < FAST.max_epochs  # early stopping stopped it


def test_undefined_targets_are_left_out_and_seeds_differ(rng) -> None:
    x, y = separable(rng, n=90)
    y = y.copy()
    y[::9] = -1  # e.g. samples of inactive classes
    holdout = np.arange(90) >= 70
    rows = probe_seeds(x, y, ~holdout, {"holdout": holdout}, FAST, device="cpu")
    assert all(r["n_fit"] + r["n_stop"] == np.sum((y >= 0) & ~holdout) for r in rows)
    assert rows[0]["n_eval"] == np.sum((y >= 0) & holdout)
    a, b = stratified_split(y[y >= 0], 0.2, 0)[1], stratified_split(y[y >= 0], 0.2, 1)[1]
    assert not np.array_equal(a, b) and len(a) == len(b)


def test_probe_training_is_deterministic_per_seed(rng) -> None:
    x, y = separable(rng, n=120)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    a = train_linear_probe(xt[:100], yt[:100], xt[100:], yt[100:], 3, FAST, seed=4)
    b = train_linear_probe(xt[:100], yt[:100], xt[100:], yt[100:], 3, FAST, seed=4)
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=0)


def test_targets() -> None:
    labels = np.array([5, 2, 7, 9, 2, 5])
    active, new = np.array([2, 5, 7]), np.array([7])
    np.testing.assert_array_equal(cohort_target(labels, active, new), [0, 0, 1, -1, 0, 0])
    with pytest.raises(ConfigError, match=r"new classes \[9\]"):
        cohort_target(labels, active, np.array([9]))
    curv = np.array([0.1, np.nan, 0.5, 0.9, 0.3, 0.7, 0.2, 0.8])
    np.testing.assert_array_equal(quantile_target(curv, 2), [0, -1, 1, 1, 0, 1, 0, 1])
    t = standard_targets({"train": labels, "test": labels[:3]}, active, new, curvature=curv[:6])
    assert set(t) == {"class", "cohort", "curvature_q4"} and set(t["curvature_q4"]) == {"train"}
    np.testing.assert_array_equal(t["class"]["test"], [1, 0, 2])
    # First task: no old classes, so no cohort target.
    assert "cohort" not in standard_targets({"train": labels}, active, active)


@pytest.mark.quality
def test_probe_features_table_and_seed_aggregate(rng) -> None:
    x, y = separable(rng, n=150, d=6, k=2)
    noise = rng.standard_normal((150, 6)).astype(np.float32)
    arrays = {
        ("train", "block1", "pooled"): x[:120],
        ("test", "block1", "pooled"): x[120:],
        ("train", "block1", "stats"): noise[:120],
        ("test", "block1", "stats"): noise[120:],
    }
    holdout = np.arange(120) < 30
    targets = {"class": {"train": y[:120], "test": y[120:]}, "q": {"train": y[:120]}}
    table = probe_features(FakeFeatures(arrays), targets, holdout, FAST, context={"epoch": 7}, device="cpu")
    assert list(table.columns[:6]) == ["epoch", "layer", "representation", "target", "seed", "eval_split"]
    # 2 representations x (class: holdout + test, q: holdout only) x 3 seeds
    assert len(table) == 2 * 3 * 3 and set(table.eval_split) == {"holdout", "test"}
    assert (table.query("target == 'q'").eval_split == "holdout").all()
    agg = aggregate_seeds(table)
    assert len(agg) == 6 and (agg.n_seeds == 3).all()
    sep = agg.query("representation == 'pooled' and target == 'class' and eval_split == 'test'").iloc[0]
    assert sep.epoch == 7
    at_least("separable features: mean test accuracy", sep.accuracy_mean, 0.98)
    rand = agg.query("representation == 'stats' and target == 'class' and eval_split == 'holdout'").iloc[0]
    below("noise features: mean holdout accuracy (2 classes, 30 samples)", rand.accuracy_mean, 0.8)
    for _, row in agg.iterrows():
        accs = table[
            (table.representation == row.representation)
            & (table.target == row.target)
            & (table.eval_split == row.eval_split)
        ].accuracy
        assert row.accuracy_mean == pytest.approx(accs.mean())
        assert row.accuracy_std == pytest.approx(accs.std(ddof=1), nan_ok=True)
        assert row.accuracy_ci95 == pytest.approx(
            4.302653 * accs.std(ddof=1) / np.sqrt(3), rel=1e-5, nan_ok=True
        )


def test_aggregate_of_one_seed_has_no_spread() -> None:
    table = pd.DataFrame(
        {
            "layer": ["a"],
            "seed": [0],
            "accuracy": [0.5],
            "loss": [1.0],
            "fit_accuracy": [1],
            "best_epoch": [3],
        }
    )
    agg = aggregate_seeds(table)
    assert agg.n_seeds.tolist() == [1] and np.isnan(agg.accuracy_std[0]) and np.isnan(agg.accuracy_ci95[0])


def test_bad_inputs_are_named(rng) -> None:
    with pytest.raises(ConfigError, match="stop_fraction"):
        ProbeSettings(stop_fraction=1.5)
    x, y = separable(rng, n=20)
    with pytest.raises(ProbeError, match="two targets"):
        probe_seeds(x, np.zeros(20, dtype=np.int64), np.ones(20, bool), {}, FAST, device="cpu")
    with pytest.raises(ProbeError, match="one entry per sample"):
        probe_seeds(x, y[:10], np.ones(20, bool), {}, FAST, device="cpu")


@pytest.mark.quality
def test_batched_probes_equal_one_at_a_time(rng) -> None:
    """Layers x seeds fitted together (epochlens.probes.batched) give the probes fitted one at a
    time: the same accuracies (within 0.01; here equal to 1e-4), best epochs and stopping epochs."""
    from epochlens.probes.batched import batched_rows

    n, d, k = 600, 12, 3
    y = rng.integers(0, k, n)
    centers = rng.normal(size=(k, d))
    x = np.stack([(s * centers[y] + rng.normal(size=(n, d)) + 3).astype(np.float32) for s in (0.0, 0.4, 1.5)])
    fit = np.arange(n) < 450
    evals = {"holdout": ~fit, "fit": fit}
    settings = ProbeSettings(seeds=(0, 3), max_epochs=40, patience=5, batch_size=64)
    together = batched_rows(torch.as_tensor(x), y, fit, evals, settings)
    for layer in range(len(x)):
        alone = probe_seeds(torch.as_tensor(x[layer]), y, fit, evals, settings, "cpu")
        assert len(alone) == len(together[layer]) == 4
        for a, b in zip(alone, together[layer], strict=True):
            assert (a["seed"], a["eval_split"], a["n_fit"], a["n_stop"]) == (
                b["seed"],
                b["eval_split"],
                b["n_fit"],
                b["n_stop"],
            )
            assert abs(a["accuracy"] - b["accuracy"]) < 1e-4 and abs(a["loss"] - b["loss"]) < 1e-3
            assert (a["best_epoch"], a["epochs_run"]) == (b["best_epoch"], b["epochs_run"])
    stopped = [row["epochs_run"] for rows in together for row in rows]
    assert min(stopped) < 40  # early stopping happened for some probe while others went on
    above("the signal layer's accuracy", together[2][0]["accuracy"], 0.9)
    below("the noise layer's accuracy", together[0][0]["accuracy"], 0.9)


def test_probe_features_batched_and_one_at_a_time_tables_agree(rng) -> None:
    """A features file's table is the same with layers fitted together or one at a time (and a
    representation of another width on its own)."""
    x, y = separable(rng, n=160, d=6)
    arrays = {}
    for layer, noise in (("a", 0.5), ("b", 2.0), ("c", 8.0)):
        z = (x + noise * rng.standard_normal(x.shape)).astype(np.float32)
        for split, rows in (("train", slice(0, 120)), ("test", slice(120, None))):
            arrays[(split, layer, "pooled")] = z[rows]
            arrays[(split, layer, "stats")] = z[rows, :4]
    feats = FakeFeatures(arrays)
    targets = {"class": {"train": y[:120], "test": y[120:]}}
    holdout = np.arange(120) < 20
    tables = [
        probe_features(feats, targets, holdout, ProbeSettings(seeds=(0, 1), max_epochs=15, batch_layers=b))
        for b in (1, 2)
    ]
    scores = ["accuracy", "loss", "fit_accuracy"]
    pd.testing.assert_frame_equal(tables[0].drop(columns=scores), tables[1].drop(columns=scores))
    assert (tables[0]["accuracy"] - tables[1]["accuracy"]).abs().max() < 0.01
    assert len(tables[0]) == 3 * 2 * 2 * 2  # layers x representations x seeds x eval splits


def test_128_layers_are_lines_per_representation_of_the_targets_that_apply(rng, tmp_path) -> None:
    """128 layers x 9 representations x 2 snapshots: a panel per snapshot of the one target that
    applies (cohort and curvature were skipped at every snapshot: named, not drawn as grey
    panels), a line per representation (accuracy against layer) with its band inside [0, 1], the
    constant guess dashed; a figure of a page, not 6,236 px wide."""
    from epochlens.plotting.common import save_figure
    from epochlens.plotting.probes import plot_probe_accuracy

    reps = ["mean", "max", "first", "last", "norms", "flat", "stats", "spectral", "pkg.mod:fn"]
    layers = [f"layer_{i:03d}" for i in range(128)]
    rows = [
        {"epoch": e, "layer": layer, "representation": r, "target": "class", "eval_split": "holdout",
         "status": "ok", "accuracy_mean": rng.uniform(0.5, 1.0), "accuracy_seed_std": 0.2,
         "accuracy_ci95": np.nan, "chance": 0.1, "n_indices": 1, "n_seeds": 10}
        for r in reps for layer in layers for e in (1, 2)
    ]  # fmt: skip
    rows += [
        {"epoch": e, "layer": layer, "representation": r, "target": t, "status": "skipped", "n_indices": 1}
        for t in ("cohort", "curvature_q4")
        for r in reps
        for layer in layers
        for e in (1, 2)
    ]
    summary = pd.DataFrame(rows)
    fig = plot_probe_accuracy(summary, "stored")
    panels = [ax for ax in fig.axes if ax.lines]
    assert [ax.get_title() for ax in panels] == [
        "class (among the active classes), epoch 1", "class (among the active classes), epoch 2"
    ]  # fmt: skip
    mean = summary.query("representation == 'max' and epoch == 2 and target == 'class'")["accuracy_mean"]
    line = next(ln for ln in panels[1].lines if ln.get_label() == "max")
    np.testing.assert_allclose(line.get_ydata(), mean.to_numpy())
    assert len(panels[1].lines) == len(reps) + 1  # and the constant guess
    bands = np.concatenate([c.get_paths()[0].vertices[:, 1] for c in panels[1].collections])
    assert bands.min() >= 0.0 and bands.max() <= 1.0  # mean ± 0.2 sd clipped to an accuracy's range
    skipped = "not shown, skipped at every epoch: old vs new classes, curvature quantile bin"
    assert skipped in fig.get_suptitle()
    save_figure(fig, [tmp_path / "probe_accuracy.png"])
    width, height = plt.imread(tmp_path / "probe_accuracy.png").shape[1::-1]
    assert width < 2000 and height < 1400, (width, height)
