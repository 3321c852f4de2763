"""Device per rule: a job computes on the config's device when its resources give it a GPU, on
the CPU otherwise; a CUDA index is checked against what the job sees; the plan of a profile says
which rules use which device (epochlens doctor --profile)."""

from __future__ import annotations

import pytest
import torch

from epochlens.device import job_device
from epochlens.errors import ConfigError
from epochlens.resources import gpu_request, gpus_requested
from epochlens.resources import job_device as job_device_name
from epochlens.rule_devices import (
    PER_JOB,
    ProfileSettings,
    RuleSpec,
    format_plan,
    plan_checks,
    plan_devices,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.mark.parametrize(
    ("resources", "gpus"),
    [
        ({}, 0),
        ({"mem_mb": 4000}, 0),
        ({"gpu": 1}, 1),
        ({"gpu": "2"}, 2),
        ({"gpu": 0}, 0),
        ({"gpu_model": "a100"}, 1),  # the SLURM plugin asks for --gpus=a100:1
        ({"gpu_model": "a100", "gpu": 2}, 2),
        ({"gpu": 0, "gres": "gpu:1"}, 1),  # the profile's --gres alternative
        ({"gres": "gpu"}, 1),
        ({"gres": "gpu:a100:4"}, 4),
        ({"gres": "'gpu:2'"}, 2),  # quoted as in a profile
        ({"gres": "shard:1"}, 0),
        ({"gres": "gpu:1,shard:2"}, 1),
    ],
)
def test_gpus_a_job_asks_for(resources, gpus):
    assert gpus_requested(resources) == gpus


def test_the_device_applies_to_jobs_given_a_gpu_only():
    gpu, none = {"gpu": 1}, {"mem_mb": 4000}
    for device in ("auto", "cuda", "cuda:1", "mps", "cpu"):
        assert job_device_name(device, gpu) == device
        assert job_device_name(device, none) == "cpu"
    assert gpu_request("auto") == gpu_request("cuda:0") == 1 and gpu_request("cpu") == 0


@no_cuda
def test_a_cpu_job_never_asks_for_cuda():
    """device: cuda on a machine (node) without CUDA: the job without a GPU computes on the CPU;
    the job given one fails with what it sees and the fix."""
    assert job_device("cuda", {"mem_mb": 4000}) == torch.device("cpu")
    assert job_device("cuda:7", {}) == torch.device("cpu")
    with pytest.raises(ConfigError) as err:
        job_device("cuda", {"gpu": 1})
    text = str(err.value)
    assert "device: 'cuda', but this process sees no CUDA device" in text
    assert "the job was given 1 GPU(s)" in text and "device: auto" in text
    assert job_device("auto", {"gpu": 1}) == torch.device("cpu")  # auto falls back


def test_a_cuda_index_is_checked_against_the_gpus_the_job_sees():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on a GPU machine: CUDA_VISIBLE_DEVICES=0)")
    count = torch.cuda.device_count()
    assert job_device(f"cuda:{count - 1}", {"gpu": count}) == torch.device("cuda", count - 1)
    with pytest.raises(ConfigError) as err:
        job_device(f"cuda:{count}", {"gpu": count})
    text = str(err.value)
    assert f"this process sees {count} CUDA device(s)" in text and "CUDA_VISIBLE_DEVICES" in text
    assert f"give the rule {count + 1} GPUs" in text and "use device: cuda" in text


SLURM = ProfileSettings(
    "slurm",
    executor="slurm",
    set_resources={"curvature_shard": {"cpus_per_gpu": 4}, "evaluate_checkpoint": {"gres": "gpu:1"}},
    default_resources={"mem_mb": 4000, "runtime": 60},
)
LOCAL = ProfileSettings("default")
RULES = [
    RuleSpec("train_lop", resources={"gpu": 1, "mem_mb": 16000}, uses_device=True),
    RuleSpec("curvature_shard", resources={"gpu": 1}, uses_device=True),
    RuleSpec("evaluate_checkpoint", uses_device=True),
    RuleSpec("probes_epoch", uses_device=True),
    RuleSpec("prepare_data"),
    RuleSpec("plot_accuracy", local=True),
]


def test_the_plan_follows_the_resources_as_snakemake_merges_them():
    plan = {r.rule: r for r in plan_devices(RULES, SLURM, "cuda")}
    assert (plan["train_lop"].gpus, plan["train_lop"].device, plan["train_lop"].source) == (
        1,
        "cuda",
        "workflow",
    )
    assert plan["curvature_shard"].device == "cuda"
    # The profile gives evaluate_checkpoint a GPU (--gres): then it uses the device.
    assert (plan["evaluate_checkpoint"].gpus, plan["evaluate_checkpoint"].source) == (1, "set-resources")
    assert plan["evaluate_checkpoint"].device == "cuda"
    assert (plan["probes_epoch"].gpus, plan["probes_epoch"].device) == (0, "cpu")
    assert plan["prepare_data"].device is None  # its script uses no torch device
    assert plan["plot_accuracy"].runs_on == "submit host" and plan["probes_epoch"].runs_on == "cluster job"
    assert {r.runs_on for r in plan_devices(RULES, LOCAL, "cuda")} == {"this machine"}
    # set-resources win over the workflow; default-resources fill in; a function is per job.
    off = ProfileSettings("p", "slurm", {"train_lop": {"gpu": 0}}, {"gpu": 1})
    plan = {r.rule: r for r in plan_devices(RULES, off, "cuda")}
    assert (plan["train_lop"].gpus, plan["train_lop"].device) == (0, "cpu")
    assert (plan["probes_epoch"].gpus, plan["probes_epoch"].source) == (1, "default-resources")
    per_job = ProfileSettings("p", "slurm", default_resources={"gpu_model": PER_JOB})
    plan = {r.rule: r for r in plan_devices(RULES, per_job, "cuda")}
    assert (
        plan["probes_epoch"].gpus is None and plan["probes_epoch"].device == "cuda if given a GPU, else cpu"
    )
    table = format_plan(plan_devices(RULES, SLURM, "cuda"), SLURM, "cuda")
    assert "executor: slurm" in table and "- (no torch)" in table


def test_plan_checks_name_what_cannot_work():
    statuses = lambda checks: [(name, status) for name, status, _ in checks]  # noqa: E731
    ok = plan_checks(plan_devices(RULES, SLURM, "cuda"), SLURM, "cuda")
    assert statuses(ok) == [("devices", "ok")] and "cpu in probes_epoch" in ok[0][2]
    # cuda:1 where each job is given one GPU (it sees cuda:0 only): fails, per rule, with the fix.
    bad = plan_checks(plan_devices(RULES, SLURM, "cuda:1"), SLURM, "cuda:1")
    assert statuses(bad) == [("devices", "fail")] * 3
    assert "each train_lop job is given 1 GPU(s), which it sees as cuda:0" in bad[0][2]
    assert "set-resources: train_lop: {gpu: 2}" in bad[0][2]
    # On this machine every GPU is visible to every job: cuda:1 is the machine's second GPU.
    assert statuses(plan_checks(plan_devices(RULES, LOCAL, "cuda:1"), LOCAL, "cuda:1")) == [("devices", "ok")]
    wasted = plan_checks(plan_devices(RULES, SLURM, "cpu"), SLURM, "cpu")
    assert statuses(wasted) == [("devices", "warn")] and "will not use" in wasted[0][2]
    none = ProfileSettings("bare", "slurm")
    unused = plan_checks(plan_devices([RuleSpec("x", uses_device=True)], none, "cuda"), none, "cuda")
    assert statuses(unused) == [("devices", "warn")] and "no rule is given a GPU" in unused[0][2]
