"""Helpers for tests that drive the Snakemake workflow through its command line."""

from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch
import yaml
from job_server import JobServer
from snakemake_server import SnakemakeServer

from epochlens.layout import Layout

REPO = Path(__file__).resolve().parents[1]
#: Snakemake commands of this process: ``SNAKEMAKE.run(args)`` is ``python -m snakemake *args``.
SNAKEMAKE = SnakemakeServer()
#: Script jobs of this process's Snakemake commands, forked from a process with torch & co imported.
JOBS = JobServer()
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "config", "src", "profiles", "envs", "report")


def copy_workflow(dest: Path) -> Path:
    """Copy the workflow (Snakefile, rules, scripts, config, library) so a test may edit it, with
    the library's bytecode: where PYTHONDONTWRITEBYTECODE is set (as on CI) every job and dry run
    would compile the modules it imports again (an edited module's is stale, and not used)."""
    compile_library()
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("*.egg-info"))
        else:
            shutil.copy2(src, dest / part)
    return dest


@cache
def compile_library() -> None:
    """Bytecode of src/ and scripts/ (compileall writes it whatever PYTHONDONTWRITEBYTECODE says;
    files already compiled are skipped), once per test process. The copies keep the sources'
    mtimes (copytree), so the bytecode stays valid in them."""
    compileall.compile_dir(REPO / "src", quiet=1)
    compileall.compile_dir(REPO / "scripts", quiet=1, maxlevels=0)


def snakemake(
    workflow: Path,
    workdir: Path,
    *args: str,
    configfile: Path | None = None,
    check: bool = True,
    keep_going: bool = True,
    forked_jobs: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``snakemake`` on ``workflow``'s Snakefile in ``workdir``; output in .stdout (merged).
    ``keep_going=False`` also leaves out the workflow profile (profiles/default sets keep-going).
    ``forked_jobs``: script jobs forked from tests/job_server.py (their libraries imported already);
    False where a test reads what Snakemake's benchmark files measure of a job."""
    cmd = ["--snakefile", str(workflow / "Snakefile"), "--directory", str(workdir)]
    cmd += ["--cores", "2", "--show-failed-logs"]
    cmd += ["--keep-going"] if keep_going else ["--workflow-profile", "none"]
    cmd += args
    if configfile:  # last: --configfile takes several values and would swallow a target
        cmd += ["--configfile", str(configfile)]
    # `python -m snakemake *cmd`, started faster (tests/snakemake_server.py)
    proc = SNAKEMAKE.run(cmd, JOBS.launcher if forked_jobs else None)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-6000:]}")
    return proc


def planned_jobs(workflow: Path, workdir: Path, *targets: str, configfile: Path | None = None) -> dict:
    """Dry run: {rule: job count} that Snakemake would run now (empty when up to date)."""
    return job_stats(snakemake(workflow, workdir, "--dry-run", *targets, configfile=configfile).stdout)


def planned_after_editing(
    workflow: Path, workdir: Path, module: str, *targets: str, configfile: Path | None = None
) -> dict:
    """Jobs planned after appending a comment to library ``module`` (e.g. ``layout.py``) of a
    workflow copy (:func:`copy_workflow`); the file (content and times) is restored afterwards."""
    path = workflow / "src" / "epochlens" / module
    text, stat = path.read_text(), path.stat()
    try:
        path.write_text(text + "\n# an edit\n")
        return planned_jobs(workflow, workdir, *targets, configfile=configfile)
    finally:
        path.write_text(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def job_stats(out: str) -> dict:
    """{rule: job count} from the "Job stats" table of a dry run's output (empty when up to date)."""
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    jobs = {}
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def planned_wildcards(out: str, rule: str) -> list[str]:
    """The ``wildcards:`` lines of the planned jobs of ``rule`` in a dry run's output ``out``."""
    blocks = re.split(r"\n(?=(?:local)?rule )", out)
    found = []
    for block in blocks:
        if re.match(rf"(?:local)?rule {rule}:", block):
            m = re.search(r"wildcards: (.*)", block)
            found.append(m.group(1).strip() if m else "")
    return found


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def save_random_checkpoint(model_cls, path: Path, seed: int, **kwargs) -> None:
    """A randomly initialised model saved as the original experiment does: a bare state_dict."""
    torch.manual_seed(seed)
    model = model_cls(**kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)


def write_cifar100_folder(folder: Path, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    """A small data set in the real ``cifar-100-python`` pickle layout (random pixels)."""
    import pickle

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, per_class in (("train", train_per_class), ("test", test_per_class)):
        labels = rng.permutation(np.repeat(np.arange(100), per_class))
        d = {
            "filenames": [f"img_{i}.png" for i in range(len(labels))],
            "batch_label": f"{split} batch",
            "fine_labels": labels.tolist(),
            "coarse_labels": (labels // 5).tolist(),
            "data": rng.integers(0, 256, size=(len(labels), 3072), dtype=np.uint8),
        }
        with open(folder / split, "wb") as f:
            pickle.dump(d, f, protocol=2)
    meta = {
        "fine_label_names": [f"class_{c}" for c in range(100)],
        "coarse_label_names": [f"super_{c}" for c in range(20)],
    }
    with open(folder / "meta", "wb") as f:
        pickle.dump(meta, f, protocol=2)


# ------------------------------------------------------------------------------------------------
# The tiny run: one factory for every workflow test.
# digits, 10 classes, 4 initial +3 every 2 epochs -> checkpoints at epochs 0, 2, 4, 6, read from a
# folder of random SmallCNN checkpoints (as a user with their own training run would).

TINY_EPOCHS = (0, 2, 4, 6)


def tiny_config(ckpt_dir: Path, **overrides) -> dict:
    """The tiny run's config (``overrides`` replace whole run sections). Its probes are cheap (one
    seed, 20 passes: most of a tiny run's time otherwise); tests/workflow/test_features_workflow.py
    runs them in full."""
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0],
        "checkpoints": {"source": "folder", "path": str(ckpt_dir / "index-{index}_epoch-{epoch}.pt")},
        "probes": {"seeds": [0], "max_epochs": 20},
    }
    run.update(overrides)
    return {"device": "cpu", "runs": {"tiny": run}}


def analysed_at(*epochs: int) -> dict:
    """:func:`tiny_config` sections: features (so probes) and ablations at ``epochs`` only (a tiny
    run's time goes mostly to these jobs' start-up)."""
    return {"features": {"epochs": list(epochs)}, "ablation": {"epochs": list(epochs)}}


def write_random_checkpoints(folder: Path, epochs=TINY_EPOCHS, index: int = 0) -> Path:
    """Random SmallCNN checkpoints (10 classes), seeded by epoch, as the user's folder."""
    from epochlens.models.networks import SmallCNN

    for epoch in epochs:
        save_random_checkpoint(
            SmallCNN, folder / f"index-{index}_epoch-{epoch}.pt", seed=epoch, num_classes=10
        )
    return folder


@dataclass
class TinyRun:
    """A workflow copy, its working directory, the config file and the checkpoint folder; ``paths``
    is the results layout under ``work`` (``run.paths.table("probes", "tiny")``)."""

    wf: Path
    work: Path
    cfg: Path
    ckpts: Path

    @property
    def paths(self) -> Layout:
        return Layout(self.work / "results")

    def __iter__(self):  # wf, work, cfg, ckpts = tiny_run(...)
        return iter((self.wf, self.work, self.cfg, self.ckpts))


def tiny_run(
    root: Path, config: dict | None = None, *targets: str, run: bool = True, name: str = "tiny"
) -> TinyRun:
    """The one tiny-run factory: copy the workflow under ``root``, write random checkpoints and
    ``config`` (default :func:`tiny_config`; a function of the checkpoint folder also works) and,
    with ``run``, run the workflow on ``targets`` (default: everything)."""
    wf = copy_workflow(root / "wf")
    work = root / "work"
    work.mkdir(exist_ok=True)
    ckpts = write_random_checkpoints(root / "model_parameters")
    if callable(config):
        config = config(ckpts)
    cfg = write_config(root / f"{name}.yaml", config if config is not None else tiny_config(ckpts))
    if run:
        snakemake(wf, work, *targets, configfile=cfg)
    return TinyRun(wf, work, cfg, ckpts)
