"""probes.targets by kind of run: defaults, a classifier's unchanged params, the refusals."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from userproject.training_project import regression_run

from epochlens import config as run_config
from epochlens.errors import ConfigError
from epochlens.probes.settings import ProbeSettings

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "config" / "schema.yaml"


def classifier_run(**sections) -> dict:
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0],
    }
    run.update(copy.deepcopy(sections))
    return run


def validate(run: dict) -> dict:
    return run_config.validate({"runs": {"r": run}}, SCHEMA)["runs"]["r"]


def test_default_targets_follow_the_kind_of_run(tmp_path) -> None:
    regression = run_config.probe_params(validate(regression_run(tmp_path)))
    assert regression["targets"] == ["target", "target_quantile", "curvature"]
    assert regression["target_bins"] == 4 and regression["curvature_bins"] == 4
    # A classifier's params are what they were before regressions were probed: no rerun.
    classifier = run_config.probe_params(validate(classifier_run()))
    assert classifier == {
        "settings": {
            "seeds": [0, 1, 2],
            "stop_fraction": 0.15,
            "max_epochs": 200,
            "patience": 10,
            "lr": 0.01,
            "weight_decay": 0.0001,
            "batch_size": 512,
        },
        "targets": ["class", "cohort", "curvature"],
        "curvature_bins": 4,
    }
    tuned = validate(regression_run(tmp_path, probes={"ridge_alphas": [0.1, 1.0], "target_bins": 3}))
    params = run_config.probe_params(tuned)
    assert params["settings"]["ridge_alphas"] == [0.1, 1.0] and params["target_bins"] == 3
    assert ProbeSettings(**params["settings"]).ridge_alphas == (0.1, 1.0)


@pytest.mark.parametrize(
    ("kind", "targets", "message"),
    [
        (
            "regression",
            ["class", "curvature"],
            r"\['class'\] are a classifier's targets.*probes.targets: \['target', 'curvature'\]",
        ),
        (
            "regression",
            ["cohort"],
            r"the run is a regression.*target \(ridge regression.*\['target_quantile'\]",
        ),
        ("classifier", ["class", "target_quantile"], r"\['target_quantile'\] are a regression's targets"),
        ("classifier", ["target"], r"probes.targets: \['class'\], or leave it out"),
    ],
)
def test_targets_of_the_other_kind_are_refused(tmp_path, kind, targets, message) -> None:
    probes = {"targets": targets}
    run = regression_run(tmp_path, probes=probes) if kind == "regression" else classifier_run(probes=probes)
    with pytest.raises(ConfigError, match="runs.r.probes.targets") as err:
        validate(run)
    assert re.search(message, str(err.value)), str(err.value)


def test_disabled_probes_and_a_ridge_probe_without_samples_to_choose_its_penalty(tmp_path) -> None:
    validate(regression_run(tmp_path, probes={"enabled": False, "targets": ["class"]}))  # not probed: fine
    with pytest.raises(ConfigError, match="stop_fraction: 0 leaves the ridge probe"):
        validate(regression_run(tmp_path, probes={"stop_fraction": 0}))
    validate(regression_run(tmp_path, probes={"stop_fraction": 0, "ridge_alphas": [0.01]}))
    validate(regression_run(tmp_path, probes={"stop_fraction": 0, "targets": ["target_quantile"]}))
