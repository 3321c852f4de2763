"""A user's project whose training is its own script (nothing here imports epochlens)::

code/                     the user's git repository (copied from training/, one commit)
  train.py                plain PyTorch: trains invnet's MLP on --data, saves ckpt_{epoch}.pt
                          into --out and its resume state into --resume every epoch
  invnet/model.py         the model (factory "invnet.model:build"), imported by train.py
  configs/*.json          the script's configs (base; q001/q002/q003 as in the README example)
  fail.py, nothing.py     scripts that fail: exit status 3; exit 0 without the checkpoints
data/matrices.npz         x_* (N, 2, 2) float32 matrices; y_* (N, 4) float32 their inverses,
                          flattened (a regression, as seed 004's); with task classification the
                          sign of the determinant (int64 class ids)
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TEMPLATE = Path(__file__).parent / "training"
FACTORY = "invnet.model:build"


@dataclass
class TrainingProject:
    root: Path  # the working directory of the runs
    repo: Path  # root/code, a git repository
    npz: Path  # root/data/matrices.npz
    commit: str  # the repository's HEAD once built

    def git(self, *args: str) -> str:
        return git(self.repo, *args)


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=Test", "-c", "user.email=test@example.org", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def matrices(n: int, rng: np.random.Generator, task: str) -> tuple[np.ndarray, np.ndarray]:
    """n well-conditioned 2x2 matrices; labels: det > 0 (classification) or the inverse."""
    xs = []
    while len(xs) < n:
        a = rng.standard_normal((2, 2))
        if np.linalg.cond(a) < 8:
            xs.append(a)
    x = np.asarray(xs, np.float32)
    if task == "regression":
        return x, np.linalg.inv(x).reshape(n, 4).astype(np.float32)
    return x, (np.linalg.det(x) > 0).astype(np.int64)


def build_training_project(
    root: str | Path, task: str = "regression", n_train: int = 96, n_test: int = 48, seed: int = 0
) -> TrainingProject:
    root = Path(root)
    repo = root / "code"
    shutil.copytree(TEMPLATE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the user's training script")
    rng = np.random.default_rng(seed)
    x_train, y_train = matrices(n_train, rng, task)
    x_test, y_test = matrices(n_test, rng, task)
    npz = root / "data" / "matrices.npz"
    npz.parent.mkdir(parents=True)
    np.savez(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return TrainingProject(root, repo, npz, git(repo, "rev-parse", "HEAD"))


def regression_run(folder: Path, **sections) -> dict:
    """A regression run config of the user's MLP (invnet, read from this template) on an .npz in
    ``folder``, with empty checkpoint files for epochs 0 and 5 (for config checks, not for jobs)."""
    import copy

    (folder / "ckpt").mkdir(exist_ok=True)
    for epoch in (0, 5):
        (folder / "ckpt" / f"m_{epoch}.pt").touch()
    run = {
        "data": {"source": "npz", "path": str(folder / "matrices.npz")},
        "model": {"factory": FACTORY, "project_path": str(TEMPLATE)},
        "task": "regression",
        "schedule": "none",
        "checkpoints": {"source": "folder", "path": str(folder / "ckpt" / "m_{epoch}.pt"), "key": "model"},
    }
    run.update(copy.deepcopy(sections))
    return run
