"""A run whose training is the user's own command (checkpoints.source: command) in the config logic:
its checkpoints are the listed epochs in the run's layout, and what cannot work is refused before
any job, naming the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from epochlens import config as run_config
from epochlens.errors import ConfigError
from epochlens.layout import RESULTS

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"
COMMAND = "python code/train.py --seed {seed} --data {data} --out {output} --resume {resume}"


def command_run(**changes) -> dict:
    run = {
        "data": {"source": "digits"},
        "model": {"factory": "invnet.model:build", "project_path": None},
        "schedule": "none",
        "indices": [0, 1],
        "epochs": [10, 0, 5],
        "checkpoints": {"source": "command", "command": COMMAND, "path": "ckpt_{epoch}.pt", "key": "model"},
    }
    for key, value in changes.items():
        if value is None:
            run.pop(key)
        else:
            run[key] = value
    return copy.deepcopy(run)


def validated(**changes) -> dict:
    return run_config.validate({"runs": {"q": command_run(**changes)}}, SCHEMA)


def test_the_checkpoints_are_the_listed_epochs_in_the_runs_layout():
    cfg = validated()
    run = cfg["runs"]["q"]
    assert run_config.checkpoint_epochs(run) == [0, 5, 10] == run_config.analysis_epochs("q", run)
    assert run_config.checkpoint_path("q", run, "1", "0005") == RESULTS.checkpoint("q", 1, 5)
    assert not run_config.needs_file(run) and run_config.missing_checkpoints(cfg) == []
    assert run["checkpoints"]["allow_dirty"] is False and run["checkpoints"]["files"] == []
    assert run_config.model_param(run)["key"] == "model"  # read as folder checkpoints are


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epochs": None}, r"runs\.q\.epochs: checkpoints\.source: command needs the epochs"),
        (
            {"checkpoints": {"source": "command", "command": "train {sed} {output}", "path": "c_{epoch}.pt"}},
            r"runs\.q\.checkpoints\.command: unknown placeholder\(s\) \['\{sed\}'\]",
        ),
        (
            {"checkpoints": {"source": "command", "command": "train --seed {seed}", "path": "c_{epoch}.pt"}},
            r"runs\.q\.checkpoints\.command has no \{output\}",
        ),
        ({"checkpoints": {"source": "command", "path": "c_{epoch}.pt"}}, r"command"),
        ({"checkpoints": {"source": "command", "command": COMMAND, "path": "ckpt.pt"}}, r"path"),
        (
            {"schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2}},
            r"runs\.q\.schedule: a training command's run has schedule: none",
        ),
    ],
)
def test_what_cannot_work_is_refused_naming_the_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        validated(**changes)


def test_a_factory_model_is_trained_by_a_command_or_read_from_a_folder():
    with pytest.raises(ConfigError, match=r"runs\.q\.model\.factory: .*source: command"):
        validated(checkpoints={"source": "train"}, epochs=None)


LDS = {"enabled": True, "methods": ["identity"], "lds": {"enabled": True, "subsets": 4}}


def with_command(command: str, **checkpoints) -> dict:
    return {"source": "command", "command": command, "path": "ckpt_{epoch}.pt", "key": "model", **checkpoints}


@pytest.mark.parametrize(
    ("command", "missing"),
    [(COMMAND, r"\{subset\}"), (COMMAND.replace("--data {data}", "--subset {subset}"), r"\{data\}")],
)
def test_lds_of_a_command_run_needs_its_subset_contract(command, missing):
    """LDS retrains the run by its command, once per subset: only a command that accepts a
    training-subset file ({subset}, positions in {data}'s x_train) can; the error names the keys."""
    with pytest.raises(
        ConfigError,
        match=r"runs\.q\.influence\.lds: it retrains the run by running runs\.q\.checkpoints\.command once "
        rf"per random subset .* has no {missing}\. Add \{{subset\}} .* "
        r"Or set runs\.q\.influence\.lds\.enabled: false",
    ):
        validated(checkpoints=with_command(command), influence=LDS)


def test_lds_of_a_command_run_with_subset_and_data():
    command = COMMAND + " --subset {subset}"
    run = validated(checkpoints=with_command(command), influence=LDS)["runs"]["q"]
    params = run_config.lds_retrain_params(run)
    assert params["run"]["command"] == {
        "command": command,
        "path": "ckpt_{epoch}.pt",
        "epochs": [0, 5, 10],
        "seed": 0,
    }
    assert params["run"]["model"]["key"] == "model" and params["run"]["task"] == "classification"
    assert params["lds"] == {"enabled": True, "subsets": 4, "fraction": 0.5, "seed": 0}
    # what neither the command's checkpoints nor their measurement depend on: no rerun
    dirty = validated(checkpoints=with_command(command, allow_dirty=True), influence=LDS)["runs"]["q"]
    assert run_config.lds_retrain_params(dirty) == params
    with pytest.raises(ConfigError, match=r"start: previous warm-starts the pipeline's own recipe"):
        validated(
            checkpoints=with_command(command),
            influence={**LDS, "lds": {"enabled": True, "start": "previous"}},
        )


def test_the_subset_placeholder_is_known_and_a_command_without_it_is_as_before():
    from epochlens.formats.command import CommandSpec

    spec = CommandSpec.from_config(
        "q", validated(checkpoints=with_command("train {subset} {output}"))["runs"]["q"]
    )
    assert spec.uses_subset and spec.needs_data and not spec.uses_data  # its {subset} is made from {data}
    plain = CommandSpec.from_config("q", validated()["runs"]["q"])
    assert not plain.uses_subset and plain.needs_data
    nothing = CommandSpec.from_config("q", validated(checkpoints=with_command("train {output}"))["runs"]["q"])
    assert not nothing.needs_data
