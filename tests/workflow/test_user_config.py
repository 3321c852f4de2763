"""Which configuration a user's command gets, run the way users run it: from the repository root,
with the repository's Snakefile and workflow profile, no --directory and no copied workflow.

A user's ``--configfile`` is the whole configuration; the embedded default (config/config.yaml,
the digits demo) applies only when no config file is given, ``--config key=value`` overrides
included. Dry runs only (``--forceall``, so results already in the repository do not change the
plan): nothing is written to results/ and no lock is left in .snakemake/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wfutil import REPO, job_stats, write_config

pytestmark = pytest.mark.workflow

# digits (2 seeds, 26 checkpoints each), digits_noisy (1 seed, 6 checkpoints, influence) and
# polarity (a transformer on sentences: 1 seed, 3 checkpoints)
DEMO_TRAINING = {"train_digits": 2, "train_digits_noisy": 2, "train_polarity": 1}
DEMO_EVALUATIONS = 52 + 12 + 3  # digits_noisy: two seeds, for the comparison


@pytest.fixture
def from_repo_root():
    """Run ``snakemake --dry-run --forceall ARGS`` in the repository root; return its output.

    Afterwards: results/ is as it was, no lock is left, and a .snakemake/ folder the dry run
    created (empty folders and a cache of file times, no job metadata) is removed again.
    """
    protected = [
        f for f in (REPO / "results").glob("*/index-*/checkpoints/*.pt") if not os.access(f, os.W_OK)
    ]
    if protected:  # a --forceall plan would train them again: Snakemake refuses (upgrading.md)
        pytest.skip(
            f"results/ holds write-protected checkpoints ({protected[0]}): run as root, or make clean"
        )
    results_before = (REPO / "results").exists()
    state = REPO / ".snakemake"
    state_before = state.exists()

    def dry_run(*args: str) -> str:
        cmd = [sys.executable, "-m", "snakemake", "--dry-run", "--forceall", *args]
        proc = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{' '.join(args)}: snakemake failed:\n{out[-6000:]}"
        return out

    yield dry_run

    assert (REPO / "results").exists() == results_before, "the dry run wrote results/"
    locks = state / "locks"
    assert not locks.is_dir() or not any(locks.iterdir()), f"lock left in {locks}"
    metadata = state / "metadata"
    assert not metadata.is_dir() or not any(metadata.iterdir()) or state_before
    if not state_before and state.is_dir():  # empty folders and the dry run's iocache/latest.pkl
        shutil.rmtree(state)


def user_config(tmp_path: Path) -> Path:
    """A user's own study: their checkpoints in a folder (the DAG only needs the files to exist)."""
    ckpts = tmp_path / "model_parameters"
    ckpts.mkdir()
    for epoch in (0, 2, 4, 6):
        (ckpts / f"index-0_epoch-{epoch}.pt").touch()
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0],
        "checkpoints": {"source": "folder", "path": str(ckpts / "index-{index}_epoch-{epoch}.pt")},
        "features": {"enabled": False},
        "probes": {"enabled": False},
        "ablation": {"enabled": False},
    }
    return write_config(tmp_path / "mine.yaml", {"device": "cpu", "runs": {"mine": run}})


def test_user_configfile_is_the_whole_config(tmp_path, from_repo_root):
    out = from_repo_root("--configfile", str(user_config(tmp_path)))
    assert job_stats(out) == {
        "prepare_data": 1,
        "class_order": 1,
        "evaluate_checkpoint": 4,
        "accuracy_tables": 1,
        "plot_accuracy": 1,
        "curvature_shard": 4,
        "curvature_epoch": 4,
        "curvature_tables": 1,
        "plot_curvature": 1,
        "sample_outputs_shard": 1,
        "sample_outputs": 1,
        "sample_dossier": 1,
        "sample_thumbnails": 1,
        "plot_data_map": 1,
        "sample_explorer": 1,
        "all": 1,
    }
    assert "results/digits" not in out and "config/config.yaml" not in out


def test_without_configfile_the_demo_runs(from_repo_root):
    jobs = job_stats(from_repo_root())
    assert {rule: jobs.get(rule) for rule in DEMO_TRAINING} == DEMO_TRAINING
    assert jobs["evaluate_checkpoint"] == DEMO_EVALUATIONS


def test_config_overrides_alone_keep_the_demo(from_repo_root):
    """--config edits the embedded default; it does not replace it (device alone is no study)."""
    jobs = job_stats(from_repo_root("--config", "device=cpu"))
    assert {rule: jobs.get(rule) for rule in DEMO_TRAINING} == DEMO_TRAINING
    assert jobs["evaluate_checkpoint"] == DEMO_EVALUATIONS
