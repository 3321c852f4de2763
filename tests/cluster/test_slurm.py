"""The workflow on a real SLURM cluster, through the shipped profile.

tests/cluster/slurm-up.sh starts a single-node cluster from Debian's packages (munge, MariaDB,
slurmdbd, slurmctld, slurmd) with one fake GPU; the profile is installed as a user installs it
(`make slurm-profile SLURM_PARTITION=...`, nothing else given) and the bare `snakemake --profile
slurm` runs a tiny trained run. Its short jobs go to SLURM in the profile's groups, at most half as
many sbatch jobs as jobs; the plan (`snakemake -n`) shows what each job needs: a GPU and more time
for the GPU rules, none of that for the CPU rules, the memory the workflow computed from the run's
files (epochlens.memory); sacct shows that each sbatch job asked for what its jobs need in turn,
and that no local rule reached SLURM.

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
import yaml
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
# The minutes the shipped profile gives rules under set-resources (at the first attempt).
PROFILE = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
PROFILE_MINUTES = {
    rule: eval(str(res["runtime"]), {"attempt": 1})
    for rule, res in PROFILE["set-resources"].items()
    if "runtime" in res
}
# Local rules (Snakefile: localrules): they must never reach SLURM.
LOCAL_RULES = re.compile(r"all|figures|.+_tables|plot_.+|sample_dossier|sample_explorer")
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
    curvature, features, probes and ablations at the last one (14 of its 27 jobs reach SLURM, in 6
    sbatch jobs), curvature with 2 directions, probes cheap (one seed, 20 passes)."""
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


def planned_jobs(dry_run: str, local_rules: set[str]) -> list[dict]:
    """Every job of a ``snakemake -n`` listing: its rule, its group job (the group's name and its
    place in the listing; None for a job of its own) and its resources (strings, as printed);
    ``local`` if its rule is one of ``local_rules`` (a dry run does not say)."""
    jobs: list[dict] = []
    group = None
    for line in dry_run.splitlines():
        if m := re.match(r"\[.*\] Group job (\S+) ", line):
            group = (m.group(1), len(jobs))
        elif m := re.fullmatch(r"( *)(?:local)?rule (\S+):", line):
            member = group if m.group(1) else None
            jobs.append({"rule": m.group(2), "local": m.group(2) in local_rules, "group": member})
        elif jobs and (m := re.fullmatch(r" *resources: (.*)", line)):
            jobs[-1]["resources"] = dict(item.split("=", 1) for item in m.group(1).split(", "))
    return jobs


def submissions(planned: list[dict]) -> list[tuple[str, list[dict]]]:
    """The sbatch jobs the plan makes: each with the name the executor plugin puts in its comment
    (a group job's ``<group>_<its rules, sorted>``, a job of its own its rule's) and its jobs."""
    units: dict[object, list[dict]] = {}
    for n, job in enumerate(planned):
        if not job["local"]:
            units.setdefault(job["group"] or n, []).append(job)
    return [
        (
            f"{key[0]}_{'_'.join(sorted({j['rule'] for j in members}))}"
            if members[0]["group"]
            else members[0]["rule"],
            members,
        )
        for key, members in units.items()
    ]


def submission_of(job: dict) -> str:
    """The submission a SLURM job is, from the comment the executor plugin gives it:
    rule_<name>[_wildcards_...]."""
    m = re.fullmatch(r"rule_(.+?)(?:_wildcards_.*)?", job["Comment"])
    assert m, f"job {job['JobID']} has no rule in its comment: {job['Comment']!r}"
    return m.group(1)


def check_job(job: dict, shape: memory.RunShape) -> None:
    """A job of the plan asks for what the profile and the workflow say: a GPU for the GPU rules;
    time: the rules sized from the run what their run gives, training 4 h, the profile's minutes for
    the short CPU rules, its 1 h fall-back for the rest; memory: training's own request, the rules
    sized from the run what their inputs give (the run's files exist when the plan is made), the
    rest the profile's fall-back."""
    rule, res = job["rule"], job["resources"]
    where = f"{rule}: {res}"
    assert (res.get("gpu") == "1") == bool(GPU_RULES.fullmatch(rule)), where
    assert res["in_turn"] == "1", where
    if rule in job_time.RULES:  # time from the run: the tiny run's jobs take the floor
        assert job_time.minutes(rule, shape) == job_time.MIN_MINUTES
        assert res["runtime"] == str(job_time.MIN_MINUTES), where
    else:
        fallback = 240 if GPU_RULES.fullmatch(rule) else 60
        assert res["runtime"] == str(PROFILE_MINUTES.get(rule, fallback)), where
    if rule.startswith("train_"):
        assert res["mem_mb"] == "16000", where
    elif rule in ("evaluate_checkpoint", "curvature_shard"):
        assert res["mem_mb"] == str(memory.mem_mb(rule, shape)), where
    elif rule in memory.RULES:  # prepare_data, the merge, thumbnails: sizes of other inputs
        assert int(res["mem_mb"]) >= memory.mem_mb(rule, memory.RunShape()), where
    else:
        assert res["mem_mb"] == "4000", where


def check_submission(job: dict, members: list[dict]) -> None:
    """A SLURM job finished and asked for what its jobs need in turn: the sum of their times, the
    largest of their memory, a GPU with 4 CPU cores if one of them computes on a GPU."""
    where = f"job {job['JobID']} ({[m['rule'] for m in members]}): {job}"
    assert job["State"] == "COMPLETED" and job["ExitCode"] == "0:0", where
    minutes = sum(int(m["resources"]["runtime"]) for m in members)
    assert job["Timelimit"] == f"{minutes // 60:02d}:{minutes % 60:02d}:00", where
    assert job["ReqMem"] == f"{max(int(m['resources']['mem_mb']) for m in members)}M", where
    if any(m["resources"].get("gpu") == "1" for m in members):
        assert "gres/gpu=1" in job["ReqTRES"] and "gres/gpu=1" in job["AllocTRES"], where
        # cpus_per_gpu: 4 (sacct records --cpus-per-gpu in the allocation, not the request)
        assert "cpu=4" in job["AllocTRES"].split(","), where
    else:
        assert "gres/gpu" not in job["ReqTRES"] + job["AllocTRES"], where


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

    # The plan of the same run, with the run's files there (what the jobs were sized from).
    local_rules = set(re.findall(r"^localrule (\S+):", output, re.MULTILINE))  # what ran here
    assert local_rules and all(LOCAL_RULES.fullmatch(rule) for rule in local_rules), local_rules
    plan = planned_jobs(dry_run(wf, work, cfg, env, "--forceall"), local_rules)
    units = submissions(plan)
    subs = dict(units)
    assert len(subs) == len(units), "two sbatch jobs of one name: tell them apart"
    assert {j["rule"] for j in plan if not j["local"]} >= EXPECTED_RULES, plan
    grouped = {name: sorted(m["rule"] for m in members) for name, members in subs.items()}
    assert grouped["evaluate_evaluate_checkpoint"] == ["evaluate_checkpoint"] * 3, grouped  # epochs 0, 1, 2
    paths = Layout(work / "results")
    shape = memory.job_shape({"dataset": paths.dataset(RUN), "checkpoint": paths.checkpoint(RUN, 0, 2)})
    assert shape.samples > 0 and shape.model_bytes > 0
    for job in plan:
        if not job["local"]:
            check_job(job, shape)

    # Grouped, the study went to SLURM in at most half as many sbatch jobs as it has jobs; each
    # finished and asked for what its jobs need in turn. No local rule reached SLURM.
    assert sorted(submission_of(job) for job in jobs) == sorted(subs), grouped
    assert 2 * len(jobs) <= sum(len(members) for members in subs.values()), grouped
    for job in jobs:
        check_submission(job, subs[submission_of(job)])

    # The results are there, and a second run has nothing to do.
    assert len(list(Path(paths.checkpoint(RUN, 0, 0)).parent.glob("epoch_*.pt"))) == 3
    assert Path(paths.figure("accuracy_by_cohort", "png", RUN)).stat().st_size > 10_000
    assert Path(paths.figure("training_curves", "png", RUN)).exists()
    assert Path(paths.curvature_array("curvature", RUN, 0, 2)).exists()
    assert Path(paths.curvature_metadata(RUN, 0, 2)).exists()
    assert "Nothing to be done" in dry_run(wf, work, cfg, env)


def dry_run(wf: Path, work: Path, cfg: Path, env: dict, *args: str) -> str:
    """``snakemake --profile slurm -n`` of the test's run: what it prints."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(wf / "Snakefile"), "--directory", str(work)]
        + ["--profile", "slurm", "--configfile", str(cfg), "--dry-run", *args],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr
