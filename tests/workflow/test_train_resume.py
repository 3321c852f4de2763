"""A training job killed mid-run and run again ends with the same checkpoints and train log, byte
for byte, as a job that was never interrupted, the two ways a cluster kills it:

- the whole job killed at once, Snakemake with it (here kill -9 of both; a lost login session),
  then ``snakemake --unlock`` and a new ``snakemake --rerun-incomplete``;
- only the job's process killed (SLURM at the wall time), so that Snakemake deletes the job's
  outputs and retries it in the same run (``--retries``, as profiles/slurm sets for training).

digits, 10 classes, 4 initial +3 every 8 epochs (24 epochs), a checkpoint every 4; each attempt
is killed once the checkpoint of epoch 8 is kept, 16 epochs (several seconds) before the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from wfutil import copy_workflow, planned_after_editing, snakemake, write_config

from epochlens.layout import RESULTS, epoch_name

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

RUN = RESULTS.index_dir("resumable", 0)
TARGET = RESULTS.train_log("resumable", 0)
RESUME = RESULTS.resume_dir("resumable", 0)
EPOCHS = [0, 4, 8, 12, 16, 20, 24]


def config() -> dict:
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 8},
        "indices": [0],
        "checkpoints": {"source": "train", "save_every": 4},
        "train": {"batch_size": 16, "lr": 0.02, "augment": "flip_crop"},
        "curvature": {"enabled": False},
        "features": {"enabled": False},
        "probes": {"enabled": False},
        "ablation": {"enabled": False},
    }
    return {"device": "cpu", "runs": {"resumable": run}}


def command(wf: Path, work: Path, cfg: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(wf / "Snakefile"),
        "--directory",
        str(work),
        "--cores",
        "1",
        *args,
        TARGET,
        "--configfile",
        str(cfg),
    ]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended ({proc.returncode}) before {path} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.02)


def training_processes(snakemake_pid: int) -> list[psutil.Process]:
    """The process running scripts/train.py under Snakemake (a child of the snakemake process)."""
    children = psutil.Process(snakemake_pid).children(recursive=True)
    return [p for p in children if any("train.py" in part for part in p.cmdline())]


def outputs(work: Path) -> dict[str, bytes]:
    files = [RESULTS.checkpoint("resumable", 0, e) for e in EPOCHS] + [TARGET]
    return {name: (work / name).read_bytes() for name in files}


def forced_as_a_user(wf: Path, work: Path, cfg: Path) -> str | None:
    """What ``snakemake -n --forcerun train_resumable`` says where it sees the checkpoints as
    read-only, as every user but root does: root writes any file, so the checkpoints are made
    immutable (chattr +i) for the plan; None where that is not possible."""
    files = [str(work / RESULTS.checkpoint("resumable", 0, e)) for e in EPOCHS]
    if subprocess.run(["chattr", "+i", *files], capture_output=True).returncode != 0:
        return None
    try:
        args = ("-n", "--forcerun", "train_resumable")
        return snakemake(wf, work, TARGET, *args, configfile=cfg, check=False).stdout
    finally:
        subprocess.run(["chattr", "-i", *files], check=True)


def test_killed_training_resumes_to_identical_checkpoints(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    cfg = write_config(tmp_path / "resumable.yaml", config())
    reference = tmp_path / "reference"
    reference.mkdir()
    snakemake(wf, reference, TARGET, configfile=cfg)
    expected = outputs(reference)
    assert not (reference / RUN / ".resume").exists()  # deleted when the job completed
    checkpoints = [reference / RESULTS.checkpoint("resumable", 0, e) for e in EPOCHS]
    assert not [f for f in checkpoints if f.stat().st_mode & 0o222], "checkpoints not write-protected"
    refused = forced_as_a_user(wf, reference, cfg)
    assert refused is None or "Write-protected output files for rule train_resumable" in refused, refused
    # A path added to epochlens/layout.py (which train.py asks for the resume folder) retrains
    # nothing; an edit of the training code retrains.
    assert planned_after_editing(wf, reference, "layout.py", TARGET, configfile=cfg) == {}
    assert planned_after_editing(wf, reference, "training.py", TARGET, configfile=cfg) == {
        "train_resumable": 1
    }

    work = tmp_path / "work"
    work.mkdir()
    kept = work / RESUME / "checkpoints" / f"{epoch_name(8)}.pt"
    last = work / RESUME / "checkpoints" / f"{epoch_name(24)}.pt"
    job_log = work / RESULTS.log("train", "resumable", index=0)

    # 1. kill -9 of Snakemake and its job together, then run again.
    proc = subprocess.Popen(
        command(wf, work, cfg),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    wait_for(kept, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not last.exists(), "training finished before the kill: the test proves nothing"
    rows = (work / TARGET).read_text().splitlines()
    assert 8 <= len(rows) - 1 < 24  # the log so far, appended epoch by epoch

    # What a user does after losing the Snakemake process too (README, "On a SLURM cluster").
    snakemake(wf, work, "--unlock", configfile=cfg)
    again = snakemake(wf, work, TARGET, "--rerun-incomplete", configfile=cfg)
    assert "resuming training at epoch" in job_log.read_text(), again.stdout[-3000:]
    resumed_at = int(job_log.read_text().split("resuming training at epoch ")[1].split()[0])
    assert resumed_at > 1  # 9, or 5 if the kill came between checkpoint 8 and its state
    assert outputs(work) == expected
    assert not (work / RUN / ".resume").exists()

    # 2. Only the job's process killed (wall time): Snakemake deletes its outputs, retries it. The
    # checkpoints deleted first, as docs/guides/upgrading.md says to train again on purpose, and
    # the train log (the target here: Snakemake reruns a job for the outputs that are asked for).
    for name in outputs(work):
        (work / name).unlink()
    proc = subprocess.Popen(
        command(wf, work, cfg, "--retries", "1"),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    wait_for(kept, proc)
    jobs = training_processes(proc.pid)
    assert len(jobs) == 1, jobs
    jobs[0].send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-6000:]
    assert "Error in rule train_resumable" in out  # the first attempt failed ...
    assert "resuming training at epoch" in job_log.read_text()  # ... the retry resumed
    assert outputs(work) == expected
    assert not (work / RUN / ".resume").exists()
