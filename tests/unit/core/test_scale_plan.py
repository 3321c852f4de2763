"""``epochlens plan``: a transformer study's influence and ablation jobs from its config alone, and
the predicted peaks against peaks measured on small models (benchmarks/large_models.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml

from epochlens.cli import main
from epochlens.influence.layers import LayerInfo
from epochlens.influence.settings import InfluenceSettings
from epochlens.scale_plan import scores_peak

REPO = Path(__file__).resolve().parents[3]
#: Mistral-7B-v0.1's parameters (transformers' MistralConfig defaults are its sizes).
MISTRAL_7B = 7_241_732_096


def _project(tmp_path: Path, **influence) -> Path:
    """config/examples/mistral7b.yaml in a project whose two checkpoints hold config.json only."""
    config = transformers.MistralConfig()
    for step in (1000, 2000):
        config.save_pretrained(tmp_path / f"runs/mistral7b/checkpoint-{step}")
    spec = yaml.safe_load((REPO / "config/examples/mistral7b.yaml").read_text())
    spec["runs"]["mistral7b"]["influence"].update(influence)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path


def _plan(project: Path, capsys) -> dict:
    argv = ["plan", "--configfile", str(project / "config.yaml"), "--directory", str(project), "--json"]
    assert main(argv) == 0
    return {job["rule"]: job for job in json.loads(capsys.readouterr().out)["jobs"]}


def test_a_7b_study_is_planned_from_its_config_json_alone(tmp_path, capsys):
    jobs = _plan(_project(tmp_path), capsys)
    assert {r: j["jobs"] for r, j in jobs.items()} == {
        "influence_factors": 1,  # the last checkpoint
        "influence_scores": 1,
        "ablation_part": 16,  # every checkpoint, its units in 8 parts
    }
    weights = 4 * MISTRAL_7B / 1e9  # float32, as jobs load it
    factors = jobs["influence_factors"]
    assert f"GB weights {weights:.3g}," in factors["detail"]
    # 32 layers x 7 Linear modules (lm_head excluded), ~22 GB of EK-FAC factors each: a group a layer
    assert factors["detail"].startswith("ekfac, 224 layers in 32 groups")
    assert (
        weights < factors["peak_mb"] / 1e3 < 141 and weights < jobs["influence_scores"]["peak_mb"] / 1e3 < 141
    )
    # every head (32) and 8 MLP neuron groups of every layer (1280), an eighth a part: 2 passes a unit, + 1
    assert jobs["ablation_part"]["detail"].startswith("160 units x 2 modes: 321 passes a job")


def test_the_plan_follows_the_factor_budget_and_the_batch_size(tmp_path, capsys):
    base = _plan(_project(tmp_path / "base"), capsys)
    half = _plan(_project(tmp_path / "half", factor_memory_gb=12, factor_batch_size=2), capsys)
    factors, smaller = base["influence_factors"], half["influence_factors"]
    # ~22 GB of factors a layer: a group each under 24 GiB; attention + gate, up + down under 12 GiB
    assert "in 32 groups" in factors["detail"] and "in 64 groups" in smaller["detail"]
    assert smaller["peak_mb"] < factors["peak_mb"] - 15_000  # half the activations and the factors


def test_held_queries_are_capped_by_query_memory_gb():
    layer = LayerInfo("fc", None, "linear", 4096, 4096, False)  # 128 MiB a query gradient
    settings = InfluenceSettings(query_memory_gb=1.0)
    few, many = (scores_peak([layer], "ekfac", settings, q) for q in (4, 400))
    assert many - few == pytest.approx(2**30 - 4 * 8 * 4096**2)


def test_a_run_without_checkpoints_is_a_clear_error(tmp_path, capsys):
    project = _project(tmp_path)
    shutil.rmtree(project / "runs")
    argv = ["plan", "--configfile", str(project / "config.yaml"), "--directory", str(project)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("epochlens plan:") and "runs/mistral7b/checkpoint-{epoch}" in err


@pytest.mark.slow
def test_predicted_peaks_are_within_30_percent_of_measured(tmp_path):
    """Each influence and ablation job of a 2-layer Mistral-shaped LM, its factors in 6 groups, in a
    process of its own: its peak (ru_maxrss) against ``epochlens plan``'s (one group, the 4 and 8
    layers of docs/measurements.md: benchmarks/large_models.py)."""
    rows = tmp_path / "rows.json"
    shape = (
        "--hidden 256 --mlp 3072 --heads 4 --kv-heads 2 --train 8 --queries 8 --length 16 --ablation-batch 64"
    )
    argv = [sys.executable, str(REPO / "benchmarks/large_models.py"), "--layers", "2", "--budgets", "0.3"]
    argv += [*shape.split(), "--threads", "1", "--json", str(rows)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run(argv, check=True, env=env, capture_output=True, timeout=600)
    measured = json.loads(rows.read_text())
    assert [(r["job"], r["groups"]) for r in measured] == [("factors", 6), ("scores", 6), ("ablation", 6)]
    for row in measured:
        assert 0.7 <= row["predicted_mb"] / row["peak_mb"] <= 1.3, row
