"""The workflow on a real SLURM cluster, through the shipped profile.

tests/cluster/slurm-up.sh starts a single-node cluster from Debian's packages (munge, MariaDB,
slurmdbd, slurmctld, slurmd) with one fake GPU; the profile is installed as a user installs it
(`make slurm-profile SLURM_PARTITION=...`, nothing else given) and the bare `snakemake --profile
slurm` runs a tiny trained run. sacct then shows what each rule asked SLURM for: a GPU and more
time for the GPU rules, none of that for the CPU rules, the memory the workflow computed from the
run's files (epochlens.memory), and no job at all for local rules.

Needs root (to install the packages and run slurmd); skipped elsewhere, except under CI=true where
a cluster that cannot be brought up fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wfutil import REPO, copy_workflow, write_config

from epochlens import job_time, memory
from epochlens.layout import Layout

pytestmark = [pytest.mark.cluster, pytest.mark.workflow, pytest.mark.slow]

CLUSTER_SCRIPTS = REPO / "tests" / "cluster"
RUN = "slurmtiny"
# Rules that compute on a GPU when there is one: the workflow asks for one (rules/common.smk:
# get_gpu_resources), profiles/slurm/config.yaml sizes them.
GPU_RULES = re.compile(
    r"train_.+|curvature_shard|features_epoch|ablation_epoch|influence_factors|influence_scores|sample_outputs_shard"
)
# Local rules (Snakefile: localrules): they must never reach SLURM.
LOCAL_RULES = re.compile(r"(all|figures|accuracy_tables|plot_.+)")
EXPECTED_RULES = {
    "prepare_data",
    "class_order",
    f"train_{RUN}",
    "evaluate_checkpoint",
    "curvature_shard",
    "curvature_epoch",
}
# Wall-clock bound of the pipeline run. SIGINT, not SIGTERM: the executor plugin cancels its
# SLURM jobs on SIGINT and ignores SIGTERM.
RUN_TIMEOUT_S = 900
SACCT_FIELDS = "JobID Comment State ExitCode ReqTRES AllocTRES ReqMem Timelimit Elapsed".split()


def tiny_trained_config() -> dict:
    """Digits, 5 classes +5 after 1 epoch: checkpoints at epochs 0, 1, 2 (trained by the pipeline);
    curvature, features, probes and ablations at the last one (every stage's rule reaches SLURM
    once: 21 jobs, not 27), curvature with 2 directions, probes cheap (one seed, 20 passes)."""
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 5, "increment": 5, "epochs_per_task": 1},
        "indices": [0],
        "checkpoints": {"source": "train"},
        "curvature": {"n_directions": 2, "shards": 1, "epochs": [2]},
        "features": {"epochs": [2]},
        "probes": {"seeds": [0], "max_epochs": 20},
        "ablation": {"epochs": [2]},
    }
    return {"device": "auto", "runs": {RUN: run}}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Environment of a running single-node SLURM cluster (SLURM_CONF, SLURM_TEST_PARTITION)."""
    root = tmp_path_factory.mktemp("slurm")
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [str(CLUSTER_SCRIPTS / "slurm-up.sh"), str(root)],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=1200,
        )
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode == 77:
            reason = output.splitlines()[-1] if output else "cannot run here"
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI must run the SLURM test, but: {reason}")
            pytest.skip(reason)
        if proc.returncode != 0:
            pytest.fail(f"SLURM bring-up failed (exit {proc.returncode}):\n{output}\n{cluster_logs(root)}")
        print(f"{output}\n(bring-up took {time.monotonic() - started:.0f} s)")
        env = dict(line.split("=", 1) for line in (root / "env").read_text().split())
        env["SLURM_TEST_DIR"] = str(root)
        yield env
    finally:
        subprocess.run([str(CLUSTER_SCRIPTS / "slurm-down.sh"), str(root)], stdin=subprocess.DEVNULL)


def cluster_logs(root: Path, lines: int = 15) -> str:
    out = []
    for log in sorted((root / "log").glob("*")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(out)


def sacct(env: dict, since: str) -> list[dict]:
    """Every job of the cluster since ``since`` (allocations only, not their steps)."""
    out = subprocess.run(
        ["sacct", "-a", "-X", "-P", "--noheader", "-S", since, "-o", ",".join(SACCT_FIELDS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [dict(zip(SACCT_FIELDS, line.split("|"), strict=True)) for line in out.splitlines() if line]


def rule_of(job: dict) -> str:
    """The rule of a job from the comment the executor plugin gives it: rule_<name>[_wildcards_...]."""
    m = re.fullmatch(r"rule_(.+?)(?:_wildcards_.*)?", job["Comment"])
    assert m, f"job {job['JobID']} has no rule in its comment: {job['Comment']!r}"
    return m.group(1)


def check_request(rule: str, job: dict, shape: memory.RunShape) -> None:
    """A job finished and asked SLURM for what the profile and the workflow say: a GPU with 4 CPU
    cores for the GPU rules; time: the rules sized from the run what their run gives, training and
    the other GPU rules 4 h, the others 1 h; memory: training's own request, the
    rules sized from the run what their inputs give (evaluated when the job was ready: the data
    set and checkpoints existed), the rest the profile's fall-back."""
    where = f"{rule} (job {job['JobID']}): {job}"
    assert job["State"] == "COMPLETED" and job["ExitCode"] == "0:0", where
    if GPU_RULES.fullmatch(rule):
        assert "gres/gpu=1" in job["ReqTRES"] and "gres/gpu=1" in job["AllocTRES"], where
        # cpus_per_gpu: 4 (sacct records --cpus-per-gpu in the allocation, not the request)
        assert "cpu=4" in job["AllocTRES"].split(","), where
    else:
        assert "gres/gpu" not in job["ReqTRES"] + job["AllocTRES"], where
    if rule in job_time.RULES:  # time from the run: the tiny run's jobs take the floor
        assert job_time.minutes(rule, shape) == job_time.MIN_MINUTES
        assert job["Timelimit"] == "00:15:00", where
    else:  # training's own request, the profile's for the other GPU rules, its fall-back
        assert job["Timelimit"] == ("04:00:00" if GPU_RULES.fullmatch(rule) else "01:00:00"), where
    if rule.startswith("train_"):
        assert job["ReqMem"] == "16000M", where
    elif rule in ("evaluate_checkpoint", "curvature_shard"):
        assert job["ReqMem"] == f"{memory.mem_mb(rule, shape)}M", where
    elif rule in memory.RULES:  # prepare_data, the merge, thumbnails: sizes of other inputs
        assert int(job["ReqMem"][:-1]) >= memory.mem_mb(rule, memory.RunShape()), where
    else:
        assert job["ReqMem"] == "4000M", where


def test_pipeline_on_slurm(slurm, tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    work = tmp_path / "work"
    work.mkdir()
    cfg = write_config(tmp_path / "slurm.yaml", tiny_trained_config())
    env = {
        **os.environ,
        "SLURM_CONF": slurm["SLURM_CONF"],
        # sbatch, srun, sacct, ... of the test cluster, also inside jobs (see slurm-up.sh).
        "PATH": f"{slurm['SLURM_TEST_BIN']}{os.pathsep}{os.environ['PATH']}",
        # Snakemake looks for `--profile slurm` in ./slurm, then $XDG_CONFIG_HOME/snakemake/slurm.
        "XDG_CONFIG_HOME": str(tmp_path / "config-home"),
    }

    # Install the profile as users do; the partition is the only thing we give it.
    subprocess.run(
        ["make", "-s", "-C", str(REPO), "slurm-profile", f"SLURM_PARTITION={slurm['SLURM_TEST_PARTITION']}"],
        env=env,
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    profile = (tmp_path / "config-home/snakemake/slurm/config.yaml").read_text()
    shipped = (REPO / "profiles/slurm/config.yaml").read_text().splitlines()
    changed = [line for line in profile.splitlines() if line not in shipped]
    assert changed == [f"  slurm_partition: \"'{slurm['SLURM_TEST_PARTITION']}'\""]

    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 120))
    started = time.monotonic()
    proc = subprocess.run(
        ["timeout", "-s", "INT", "-k", "60", str(RUN_TIMEOUT_S)]
        + [sys.executable, "-m", "snakemake", "--snakefile", str(wf / "Snakefile")]
        + ["--directory", str(work), "--profile", "slurm", "--configfile", str(cfg)]
        # Not a resource: how soon the plugin first asks sacct about a job, and the step between
        # asks (+10 s while none finished). Its 40 s default is kind to a big cluster's database,
        # but makes each stage of this tiny DAG wait 40 s or more.
        + ["--slurm-init-seconds-before-status-checks", "2"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    jobs = sacct(env, since)
    listing = "\n".join("|".join(job[f] for f in SACCT_FIELDS) for job in jobs)
    print(f"pipeline on SLURM: {elapsed:.0f} s, exit {proc.returncode}\n{'|'.join(SACCT_FIELDS)}\n{listing}")
    timed_out = " (timed out)" if proc.returncode in (124, 137) else ""
    assert proc.returncode == 0, (
        f"snakemake --profile slurm failed{timed_out}:\n{output[-6000:]}\n"
        f"sacct:\n{listing}\n{cluster_logs(Path(slurm['SLURM_TEST_DIR']))}"
    )
    assert "Using profiles slurm and" in output

    # Every job of the run finished, and each rule asked for what the profile says.
    by_rule: dict[str, list[dict]] = {}
    for job in jobs:
        by_rule.setdefault(rule_of(job), []).append(job)
    assert EXPECTED_RULES <= set(by_rule), f"rules submitted: {sorted(by_rule)}"
    assert not [r for r in by_rule if LOCAL_RULES.fullmatch(r)], "local rules were submitted to SLURM"
    assert len(by_rule["evaluate_checkpoint"]) == 3  # epochs 0, 1, 2
    paths = Layout(work / "results")
    shape = memory.job_shape({"dataset": paths.dataset(RUN), "checkpoint": paths.checkpoint(RUN, 0, 2)})
    assert shape.samples > 0 and shape.model_bytes > 0
    for rule, rule_jobs in by_rule.items():
        for job in rule_jobs:
            check_request(rule, job, shape)

    # The results are there, and a second run has nothing to do.
    assert len(list(Path(paths.checkpoint(RUN, 0, 0)).parent.glob("epoch_*.pt"))) == 3
    assert Path(paths.figure("accuracy_by_cohort", "png", RUN)).stat().st_size > 10_000
    assert Path(paths.figure("training_curves", "png", RUN)).exists()
    assert Path(paths.curvature_array("curvature", RUN, 0, 2)).exists()
    assert Path(paths.curvature_metadata(RUN, 0, 2)).exists()
    dry = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(wf / "Snakefile"), "--directory", str(work)]
        + ["--profile", "slurm", "--configfile", str(cfg), "--dry-run"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
