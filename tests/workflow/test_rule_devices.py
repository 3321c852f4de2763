"""Device per rule on the real workflow and profiles: the rules that compute on a GPU ask for one
(under every profile), the others compute on the CPU whatever the config's device says, and
``epochlens doctor --profile`` says so before anything is submitted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from wfutil import REPO, snakemake, tiny_config, tiny_run, write_config

from epochlens.layout import RESULTS
from epochlens.rule_devices import plan_devices, profile_settings, workflow_rules

pytestmark = pytest.mark.workflow

GPU_RULES = {
    "train_digits",
    "train_digits_noisy",
    "train_polarity",
    "curvature_shard",
    "features_epoch",
    "ablation_epoch",
    "ablation_part",
    "influence_covariances",
    "influence_eigenbasis",
    "influence_corrections",
    "influence_factors",
    "influence_score_shard",
    "influence_scores",
    "influence_store_shard",
    "influence_store_scores",
    "lds_retrain",
    "sample_outputs_shard",
}


@pytest.fixture(scope="module")
def rules():
    return workflow_rules(REPO / "Snakefile")[0]  # the embedded default: every stage, training


@pytest.mark.parametrize("profile", ["profiles/default", "profiles/slurm"])
def test_gpu_rules_get_the_device_and_the_others_the_cpu(rules, profile):
    settings = profile_settings(REPO / profile, REPO / "Snakefile")
    plan = {r.rule: r for r in plan_devices(rules, settings, "cuda")}
    assert {name for name, r in plan.items() if r.gpus} == GPU_RULES
    assert {name for name, r in plan.items() if r.device == "cuda"} == GPU_RULES
    assert {name for name, r in plan.items() if r.device == "cpu"} == {
        "evaluate_checkpoint",
        "probes_epoch",
        "probes_stored",  # the probes of one representation of stored activations
        "features_stored",  # representations of stored activations: no model, CPU
        "activations_decoded",  # a parquet snapshot decoded once for them: CPU
    }
    tables_and_plots = {name for name in plan if name.startswith("plot_") or name.endswith("_tables")}
    assert all(plan[name].device is None for name in tables_and_plots)  # no torch device
    assert settings.cluster == (profile == "profiles/slurm")
    if settings.cluster:
        assert all(plan[name].runs_on == "submit host" for name in tables_and_plots)


def test_memory_and_time_plans_under_the_slurm_profile(rules, tmp_path, monkeypatch, tiny_dataset):
    """doctor --profile's memory and time tables: the sized rules' MB at a prepared run's shape (from its
    dataset.h5 in the folder doctor runs in), the profile's and the workflow's fixed requests, and
    no request for the submit host's rules."""
    from epochlens import job_time, memory
    from epochlens.data import write_dataset
    from epochlens.resource_plan import memory_plan, time_plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/digits/data").mkdir(parents=True)
    write_dataset(tiny_dataset, RESULTS.dataset("digits"))
    config = {"runs": {"digits": {"indices": [0], "epochs": [], "checkpoints": {"source": "train"}}}}
    settings = profile_settings(REPO / "profiles/slurm", REPO / "Snakefile")
    lines = {line.split()[0]: line for line in memory_plan(rules, settings, config).splitlines()[2:]}
    shape = memory.dataset_shape(RESULTS.dataset("digits"))
    asked = memory.mem_mb("sample_outputs_shard", shape)
    assert lines["sample_outputs_shard"].split()[1:4] == ["the", "run", str(asked)]
    assert "16000 (profile)" in lines["lds_retrain"] and "16000 (workflow)" in lines["train_digits"]
    assert "4000 (profile default)" in lines["class_order"]
    assert "- (submit host)" in lines["plot_accuracy"]
    times = {line.split()[0]: line for line in time_plan(rules, settings, config).splitlines()[2:]}
    for rule in job_time.RULES:  # computed from the run; the profile sets no time for them
        assert times[rule].split()[1:4] == ["the", "run", str(job_time.minutes(rule, shape))], rule
    assert "240 (profile)" in times["influence_eigenbasis"] and "480 (profile)" in times["lds_retrain"]
    assert "240 (workflow)" in times["train_digits"] and "60 (profile default)" in times["training_data"]
    assert "15 (profile)" in times["class_order"] and "30 (profile)" in times["probes_epoch"]  # grouped


def test_device_cpu_asks_for_no_gpu(tmp_path):
    cfg = write_config(tmp_path / "cpu.yaml", {"device": "cpu", "runs": tiny_config(tmp_path)["runs"]})
    environ, path, here = dict(os.environ), list(sys.path), os.getcwd()
    rules, config = workflow_rules(REPO / "Snakefile", [cfg])
    # what parsing the Snakefile changes in this process (PYTHONPATH, sys.path, cwd) is undone
    assert (dict(os.environ), sys.path, os.getcwd()) == (environ, path, here)
    assert config["device"] == "cpu"
    assert all(not r.resources.get("gpu") for r in rules)


def test_doctor_checks_the_device_against_the_profile(tmp_path):
    """cuda:1 under the SLURM profile: each GPU job is given one GPU (cuda:0), so doctor fails it
    per rule and names the fix (plain cuda passes: tests/unit/core/test_devices.py)."""
    cfg = tiny_config(tmp_path)
    cmd = [sys.executable, "-m", "epochlens", "doctor", "--profile", str(REPO / "profiles/slurm"), "--json"]
    cfg["device"] = "cuda:1"
    proc = subprocess.run(
        [*cmd, "--configfile", str(write_config(tmp_path / "one.yaml", cfg))], capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    failed = [c["detail"] for c in report["checks"] if c["name"] == "devices" and c["status"] == "fail"]
    # every GPU rule (influence shards and store, ablation parts, LDS, sample outputs); no training
    assert len(failed) == 14
    assert any("each curvature_shard job is given 1 GPU(s), which it sees as cuda:0" in d for d in failed)
    rules = {r["rule"]: r for r in report["rules"]}
    assert rules["evaluate_checkpoint"]["device"] == "cpu" and rules["features_epoch"]["device"] == "cuda:1"
    assert "verdict: " not in proc.stdout and report["verdict"].startswith("NOT READY: devices")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_on_a_cpu_node(tmp_path):
    """device: cuda where there is no GPU (a CPU node): evaluate_checkpoint, which is given no GPU,
    computes on the CPU; curvature_shard, given one, fails with what it sees and the fix."""
    off = {"enabled": False}
    config = lambda ckpts: {  # noqa: E731
        **tiny_config(ckpts, features=off, probes=off, ablation=off, curvature={"epochs": [0]}),
        "device": "cuda",
    }
    run = tiny_run(tmp_path, config, run=False)
    eval0 = RESULTS.eval_table("tiny", 0, 0)
    shard = RESULTS.curvature_shard("tiny", 0, 0, 0, 1)
    proc = snakemake(run.wf, run.work, eval0, shard, configfile=run.cfg, check=False)
    assert proc.returncode != 0
    assert (run.work / eval0).is_file()
    assert not (run.work / shard).exists()
    log = (run.work / RESULTS.log("curvature", "tiny", 0, 0, "shard_0-of-1")).read_text()
    assert "device: 'cuda', but this process sees no CUDA device" in log
    assert "the job was given 1 GPU(s)" in log
