"""Which model.hf.task loads a checkpoint, judged from its config.json before any job (a T5 with
task causal_lm used to plan every job and fail each with 'copy the files again')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epochlens import config as run_config
from epochlens.errors import ConfigError
from epochlens.models.hf_heads import TEXT_TO_TEXT, checkpoint_heads, task_problem

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


def write_config(folder: Path, **cfg) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


def test_the_head_is_read_off_the_saved_class(tmp_path) -> None:
    bert = write_config(tmp_path / "bert", model_type="bert", architectures=["BertForSequenceClassification"])
    gpt2 = write_config(tmp_path / "gpt2", model_type="gpt2", architectures=["GPT2LMHeadModel"])
    t5 = write_config(tmp_path / "t5", model_type="t5", architectures=["T5ForConditionalGeneration"])
    bare = write_config(tmp_path / "bare", model_type="llama")
    assert checkpoint_heads(bert)[2] == "sequence_classification"
    assert checkpoint_heads(gpt2)[2] == "causal_lm"
    assert checkpoint_heads(t5)[2] == TEXT_TO_TEXT
    assert checkpoint_heads(bare)[2] is None  # no head named: nothing to judge by
    assert task_problem(bert, "sequence_classification") is None
    assert "set model.hf.task: causal_lm" in task_problem(gpt2, "sequence_classification")
    assert "model_type 't5' (T5ForConditionalGeneration)" in task_problem(t5, "causal_lm")
    assert task_problem(bare, "causal_lm") is None


def test_a_t5_with_task_causal_lm_stops_the_dry_run(tmp_path) -> None:
    for step in (10, 20):
        write_config(
            tmp_path / "runs" / f"checkpoint-{step}",
            model_type="t5",
            architectures=["T5ForConditionalGeneration"],
        )
    run = {
        "data": {
            "source": "jsonl",
            "path": str(tmp_path / "data"),
            "text": {
                "tokenizer": str(tmp_path / "tok"),
                "prompt_column": "prompt",
                "target_column": "label_word",
            },
        },
        "model": {"hf": {"task": "causal_lm"}},
        "schedule": "none",
        "checkpoints": {"source": "folder", "path": str(tmp_path / "runs" / "checkpoint-{epoch}")},
        "features": {"enabled": False},
        "probes": {"enabled": False},
        "curvature": {"enabled": False},
        "ablation": {"enabled": False},
    }
    with pytest.raises(ConfigError) as err:
        run_config.validate({"runs": {"t5": run}}, SCHEMA)
    message = str(err.value)
    assert "runs.t5.model.hf.task" in message and "checkpoint-10/config.json" in message
    assert "text-to-text (encoder-decoder)" in message and "copy" not in message
