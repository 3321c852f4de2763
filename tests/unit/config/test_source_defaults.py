"""Defaults that follow a run's source and task (epochlens.config.defaults): what a user does not
have to say twice, and the error where two keys say different things."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochlens import config as run_config
from epochlens.errors import ConfigError

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


def stored_run(tmp_path, **sections) -> dict:
    (tmp_path / "acts" / "step_1").mkdir(parents=True, exist_ok=True)
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "schedule": "none",
        "checkpoints": {"source": "activations", "path": str(tmp_path / "acts" / "step_{epoch}")},
    }
    return run | sections


def validate(run: dict) -> dict:
    return run_config.validate({"runs": {"r": run}}, SCHEMA)["runs"]["r"]


def test_a_stored_activations_run_needs_no_stage_switched_off(tmp_path):
    run = validate(stored_run(tmp_path))
    assert [run[s]["enabled"] for s in ("curvature", "ablation", "influence")] == [False] * 3
    assert run["features"]["enabled"] and run["probes"]["enabled"]
    assert run_config.analysis_epochs("r", run) == [1]


def test_a_stage_switched_on_for_stored_activations_is_still_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"remove runs\.r\.ablation\.enabled: true \(off by default"):
        validate(stored_run(tmp_path, ablation={"enabled": True}))


def test_a_model_run_keeps_the_schema_defaults():
    schedule = {"initial_classes": 4, "increment": 3, "epochs_per_task": 2}
    run = {"data": {"source": "digits"}, "model": {"name": "small_cnn"}, "schedule": schedule}
    run = validate(run)
    assert run["curvature"]["enabled"] and run["ablation"]["enabled"] and not run["influence"]["enabled"]


def t5_run(tmp_path, **keys) -> dict:
    (tmp_path / "checkpoint-1").mkdir(exist_ok=True)
    hf = {k: v for k, v in {"task": keys.pop("hf_task", None)}.items() if v}
    run = {
        "data": {
            "source": "jsonl",
            "path": "data/t2t",
            "text": {"tokenizer": "tok", "prompt_column": "p", "target_column": "t"},
        },
        "model": {"hf": hf},
        "schedule": "none",
        "checkpoints": {"source": "folder", "path": str(tmp_path / "checkpoint-{epoch}")},
        "epochs": [1],
        "influence": {"enabled": True},
    }
    return run | keys


@pytest.mark.parametrize("keys", [{"hf_task": "text_to_text"}, {"task": "text_to_text"}])
def test_text_to_text_is_said_once(tmp_path, keys):
    run = validate(t5_run(tmp_path, **keys))
    assert run["model"]["hf"]["task"] == "text_to_text" and run["task"] == "text_to_text"
    assert run_config.has_token_labels(run) and run["influence"]["queries"]["select"] == "all"


def test_a_text_to_text_model_with_another_loss_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"runs\.r: model\.hf\.task: text_to_text is trained with task: "):
        validate(t5_run(tmp_path, hf_task="text_to_text", task="language_model"))
    with pytest.raises(ConfigError, match=r"task: text_to_text is the loss of a text-to-text model, but "):
        validate(t5_run(tmp_path, hf_task="causal_lm", task="text_to_text"))
    own = validate(t5_run(tmp_path, hf_task="text_to_text", task="mytasks.loss:nll"))
    assert own["task"] == "mytasks.loss:nll"
