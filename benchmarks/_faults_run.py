"""The run that ``benchmarks/faults.py --kill`` and ``--disk`` disturb: one config whose jobs are
every rule kind of the workflow, built from the workflow tests' own builders (tests/wfutil.py,
tests/userproject, the stored-activation test's snapshot writer), and Snakemake driven as a user
drives it (the workflow's default profile: keep-going, rerun-incomplete).

Runs (digits, 4 classes +3 every 2 epochs: checkpoints 0, 2, 4, 6, unless said):

* ``tiny``: trained by the pipeline with 10% flipped labels; curvature (2 shards) at epoch 6,
  features, probes and ablation at epoch 6, influence (ekfac in 2 shards, identity) with LDS
  (3 retrainings in 2 jobs), the sample dossier, data map and explorer;
* ``base`` and ``noisy``: without and with flipped labels, 2 replicates each, trained, evaluated
  and compared (a comparison needs 2 replicates per run);
* ``acts``: stored activations (a Hugging Face ``save_to_disk`` snapshot at epoch 2) with probes;
* ``mlp``: trained by the user's own command (tests/userproject: a regression, epochs 0, 2, 4).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "src", REPO / "tests", REPO / "tests" / "workflow"):
    sys.path.insert(0, str(_path))

from wfutil import tiny_config, write_config, write_random_checkpoints  # noqa: E402

from epochlens.data import read_dataset  # noqa: E402
from epochlens.layout import RESULTS  # noqa: E402

OFF = {"enabled": False}
DATA = {"source": "digits", "holdout_per_class": 5}
SCHEDULE = {"initial_classes": 4, "increment": 3, "epochs_per_task": 2}
SNAPSHOT_EPOCH = 2
INFLUENCE = {
    "enabled": True,
    "methods": ["ekfac", "identity"],
    "queries": {"max_count": 8},
    "shards": 2,
    "lds": {"enabled": True, "subsets": 3, "parts": 2, "bootstrap": 20},
}


def pipeline_run(corruption: bool, analysed: bool) -> dict:
    """A digits run the pipeline trains; ``analysed``: every analysis on, at epoch 6 only."""
    run = tiny_config(Path("unused"))["runs"]["tiny"]
    run["checkpoints"] = {"source": "train"}
    run["train"] = {"lr": 0.02, "early_stopping": False}
    if corruption:
        run["data"] = {**DATA, "corruption": {"kind": "label_flip", "fraction": 0.1, "seed": 0}}
    if not analysed:
        return {**run, "curvature": OFF, "features": OFF, "probes": OFF, "ablation": OFF}
    return {
        **run,
        "curvature": {"epochs": [6], "n_directions": 2, "shards": 2},
        "features": {"epochs": [6]},
        "ablation": {"epochs": [6]},
        "influence": INFLUENCE,
    }


def stored_run(snapshots: Path) -> dict:
    return {
        "data": DATA,
        "schedule": SCHEDULE,
        "checkpoints": {
            "source": "activations",
            "path": str(snapshots / "epoch_{epoch}"),
            "id_column": "idx",
        },
        "features": {"representations": ["pooled"]},
        "probes": {"seeds": [0], "max_epochs": 20},
        "curvature": OFF,
        "ablation": OFF,
        "influence": OFF,
    }


def every_rule_config(snapshots: Path) -> dict:
    from test_train_command_workflow import run_config as command_run

    return {
        "device": "cpu",
        "runs": {
            "tiny": pipeline_run(corruption=True, analysed=True),
            "base": {**pipeline_run(corruption=False, analysed=False), "indices": [0, 1]},
            "noisy": {**pipeline_run(corruption=True, analysed=False), "indices": [0, 1]},
            "acts": stored_run(snapshots),
            "mlp": {**command_run(), "indices": [0]},
        },
        "comparisons": [{"name": "noise", "runs": ["base", "noisy"]}],
    }


@dataclass
class Invocation:
    """What a user types (``snakemake --cores 2 --configfile my.yaml``) in ``work``, for the
    workflow at ``snakefile`` (its default profile applies: keep-going, rerun-incomplete), for
    ``targets``."""

    work: Path
    cfg: Path
    snakefile: Path = REPO / "Snakefile"
    targets: tuple[str, ...] = ()  # default: everything

    def command(self, *args: str) -> list[str]:
        where = ["--snakefile", str(self.snakefile), "--directory", str(self.work), "--cores", "2"]
        cmd = [sys.executable, "-m", "snakemake", *where, *args, *self.targets]
        return [*cmd, "--configfile", str(self.cfg)]

    def run(self, *args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.command(*args), capture_output=True, text=True, stdin=subprocess.DEVNULL)
        proc.stdout += proc.stderr
        return proc


def write_snapshots(root: Path) -> Path:
    """The stored activations (``acts``): a random SmallCNN's block activations on the digits data
    set as ``prepare_data`` writes it (made once in ``root/setup``)."""
    from test_stored_workflow import write_snapshot

    setup = root / "setup"
    ckpts = write_random_checkpoints(setup / "model_parameters", epochs=(SNAPSHOT_EPOCH,))
    cfg = write_config(setup / "data.yaml", {"device": "cpu", "runs": {"base": pipeline_run(False, False)}})
    proc = Invocation(setup, cfg).run(RESULTS.dataset("base"))
    if proc.returncode:
        raise RuntimeError(f"preparing the snapshot's data failed:\n{proc.stdout[-3000:]}")
    data = read_dataset(setup / RESULTS.dataset("base"))
    snapshots = root / "snapshots"
    ckpt = ckpts / f"index-0_epoch-{SNAPSHOT_EPOCH}.pt"
    write_snapshot(ckpt, data, snapshots / f"epoch_{SNAPSHOT_EPOCH}")
    return snapshots


def new_workdir(root: Path, name: str, snapshots: Path) -> Invocation:
    """A fresh working directory (the user's training project in it) and its config file."""
    from userproject.training_project import build_training_project

    work = build_training_project(root / name).root
    return Invocation(work, write_config(root / f"{name}.yaml", every_rule_config(snapshots)))


_STARTED = re.compile(r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    jobid: (\d+)", re.M)
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)", re.M)


def running_jobs(log: str) -> list[str]:
    """The rules of the jobs a Snakemake output shows started and not finished."""
    started = {jobid: rule for rule, jobid in _STARTED.findall(log)}
    for jobid, _ in _FINISHED.findall(log):
        started.pop(jobid, None)
    return sorted(started.values())


def started_jobs(log: str) -> list[str]:
    """The rules of the jobs a Snakemake output shows started, in the order they started."""
    return [rule for rule, _ in _STARTED.findall(log)]


def files_under(folder: Path) -> set[str]:
    return (
        {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()
    )
