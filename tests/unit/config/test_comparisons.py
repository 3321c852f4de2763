"""The comparisons section (epochlens.config.comparisons): defaults, the plan the comparison job
reads, and the plan-time errors that name the key and the fix; influence.indices."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from epochlens import config as run_config
from epochlens.errors import ConfigError

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


def digits_run(**sections) -> dict:
    """A digits run (4 classes, +3 every 2 epochs: checkpoints 0, 2, 4, 6) with two indices."""
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0, 1],
    }
    run.update(copy.deepcopy(sections))
    return run


def regression_run(**sections) -> dict:
    run = {
        "data": {"source": "npz", "path": "data.npz"},
        "model": {"factory": "mlp:build"},
        "schedule": "none",
        "task": "regression",
        "indices": [0, 1, 2],
        "checkpoints": {"source": "folder", "path": "ckpt/{index}/epoch_{epoch}.pt"},
    }
    run.update(copy.deepcopy(sections))
    return run


@pytest.fixture
def checkpoint_folders(tmp_path, monkeypatch):
    """The regression runs' checkpoints (epochs 0 and 5 of indices 0-2; schedule none: found on
    disk), under a working directory of their own."""
    monkeypatch.chdir(tmp_path)
    for folder in ("ckpt", "other"):
        for index in range(3):
            for epoch in (0, 5):
                path = tmp_path / folder / str(index) / f"epoch_{epoch}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"")
    return tmp_path


def validated(comparisons, **runs) -> dict:
    runs = runs or {
        "clean": digits_run(),
        "noisy": digits_run(
            data={"source": "digits", "holdout_per_class": 5, "corruption": {"kind": "label_flip"}}
        ),
    }
    return run_config.validate({"runs": runs, "comparisons": comparisons}, SCHEMA)


def test_defaults_and_the_plan_of_a_comparison():
    cfg = validated([{"name": "noise", "runs": ["clean", "noisy"]}])
    assert cfg["comparisons"][0] == {
        "name": "noise",
        "runs": ["clean", "noisy"],
        "metrics": None,
        "epoch": "last",
        "split": "test",
        "differences": "baseline",
    }
    (plan,) = run_config.comparison_plan(cfg)
    assert plan["metrics"] == ["accuracy", "loss"]
    assert plan["runs"] == [
        {
            "run": run,
            "kind": "classification",
            "epoch": 6,
            "indices": [0, 1],
            "sources": {"accuracy": "accuracy", "loss": "accuracy"},
        }
        for run in ("clean", "noisy")
    ]
    assert run_config.comparison_sources(cfg) == {
        "accuracy": ["clean", "noisy"],
        "regression": [],
        "curvature": [],
        "dataset": ["clean", "noisy"],
    }


def test_no_comparisons_by_default():
    cfg = run_config.validate({"runs": {"clean": digits_run(indices=[0])}}, SCHEMA)
    assert cfg["comparisons"] == [] and run_config.comparison_plan(cfg) == []


def test_mean_curvature_reads_the_curvature_table_at_an_analysed_epoch():
    cfg = validated(
        [{"name": "c", "runs": ["clean", "noisy"], "metrics": ["mean_curvature", "accuracy"], "epoch": 4}]
    )
    (plan,) = run_config.comparison_plan(cfg)
    assert [r["epoch"] for r in plan["runs"]] == [4, 4]
    assert plan["runs"][0]["sources"] == {"mean_curvature": "curvature", "accuracy": "accuracy"}
    assert run_config.comparison_sources(cfg)["curvature"] == ["clean", "noisy"]


def test_regression_runs_default_to_their_metrics_and_read_their_table(checkpoint_folders):
    cfg = validated(
        [{"name": "strategies", "runs": ["a", "b"], "differences": "all_pairs"}],
        a=regression_run(),
        b=regression_run(checkpoints={"source": "folder", "path": "other/{index}/epoch_{epoch}.pt"}),
    )
    assert run_config.is_regression_run(cfg["runs"]["a"])
    (plan,) = run_config.comparison_plan(cfg)
    assert plan["metrics"] == ["mse", "mae", "r2"] and plan["differences"] == "all_pairs"
    assert [r["epoch"] for r in plan["runs"]] == [5, 5]
    assert plan["runs"][1]["kind"] == "regression"
    assert set(plan["runs"][1]["sources"].values()) == {"regression"}


NOISY = {"source": "digits", "holdout_per_class": 5, "corruption": {"kind": "label_flip"}}


@pytest.mark.parametrize(
    ("comparison", "runs", "match"),
    [
        (
            {"runs": ["clean", "other"]},
            {},
            r"comparisons\[0\] \(c\)\.runs: \['other'\] are not runs of this config; "
            r"pick from \['clean', 'noisy'\]",
        ),
        (
            {"runs": ["clean", "noisy"], "metrics": ["mse"]},
            {},
            r"comparisons\[0\] \(c\)\.metrics: mse is a metric of regression runs, and clean is a "
            r"classification run \(task: classification\); its metrics are "
            r"\['accuracy', 'loss', 'mean_curvature'\]",
        ),
        (
            {"runs": ["a", "b"], "metrics": ["accuracy"]},
            {"a": regression_run(), "b": regression_run()},
            r"metrics: accuracy is a metric of classification runs, and a is a regression run "
            r"\(task: regression\)",
        ),
        (
            {"runs": ["clean", "reg"]},
            {"clean": digits_run(), "reg": regression_run()},
            r"\.runs: .* mixes classification and regression runs",
        ),
        (
            {"runs": ["clean", "noisy"]},
            {"clean": digits_run(), "noisy": digits_run(data=NOISY, indices=[0])},
            r"\.runs: run noisy has 1 replicate index \(\[0\]\); a confidence interval over indices "
            r"needs 2 or more: add indices to runs\.noisy\.indices",
        ),
        (
            {"runs": ["clean", "noisy"]},
            {"clean": digits_run(), "noisy": digits_run(data={"source": "digits", "test_fraction": 0.3})},
            r"\.runs: clean and noisy do not have the same test data \(data\.holdout_per_class: 5 vs 0; "
            r"data\.test_fraction: 0\.25 vs 0\.3\).*only data\.corruption may differ",
        ),
        (
            {"runs": ["clean", "noisy"], "epoch": 5},
            {},
            r"comparisons\[0\] \(c\)\.epoch: 5 is not an analysed epoch of run clean \(\[0, 2, 4, 6\]\)",
        ),
        (
            {"runs": ["clean", "noisy"], "metrics": ["mean_curvature"]},
            {"clean": digits_run(), "noisy": digits_run(data=NOISY, curvature={"enabled": False})},
            r"\.metrics: mean_curvature at epoch 6, but run noisy computes no curvature there",
        ),
        (
            {"runs": ["clean", "noisy"], "split": "holdout"},
            {"clean": digits_run(data={"source": "digits"}), "noisy": digits_run(data={"source": "digits"})},
            r"\.split: holdout, but runs \['clean', 'noisy'\] have no holdout",
        ),
    ],
)
def test_bad_comparisons_name_the_key_and_the_fix(comparison, runs, match, checkpoint_folders):
    with pytest.raises(ConfigError, match=match):
        validated([{"name": "c", **comparison}], **runs)


def test_comparison_names_are_unique_and_no_run_takes_their_folder():
    with pytest.raises(ConfigError, match=r"comparisons: names \['c'\] are used twice"):
        validated([{"name": "c", "runs": ["clean", "noisy"]}] * 2)
    with pytest.raises(ConfigError, match=r"runs\.comparisons: results/comparisons/ holds"):
        runs = {"clean": digits_run(), "comparisons": digits_run()}
        run_config.validate(
            {"runs": runs, "comparisons": [{"name": "c", "runs": ["clean", "comparisons"]}]}, SCHEMA
        )


def test_schema_errors_of_a_comparison():
    with pytest.raises(ConfigError, match=r"comparisons\.0\.runs: \['clean'\] is too short"):
        validated([{"name": "c", "runs": ["clean"]}])
    with pytest.raises(ConfigError, match=r"comparisons\.0\.metrics\.0: 'f1' is not one of"):
        validated([{"name": "c", "runs": ["clean", "noisy"], "metrics": ["f1"]}])


def test_influence_of_some_indices_only():
    run = run_config.validate({"runs": {"r": digits_run(indices=[0, 1, 2])}}, SCHEMA)["runs"]["r"]
    assert run_config.influence_indices("r", run) == [0, 1, 2]
    run["influence"]["indices"] = [2, 0]
    assert run_config.influence_indices("r", run) == [0, 2]
    with pytest.raises(ConfigError, match=r"runs\.r\.influence\.indices: \[5\] are not indices of this run"):
        run_config.validate(
            {"runs": {"r": digits_run(influence={"enabled": True, "indices": [5], "methods": ["identity"]})}},
            SCHEMA,
        )
