"""Seed 004's regression as a user has it, built in a temporary folder for the tests (nothing here
imports epochlens)::

    code/matinv/{__init__,model}.py   the user's MLP, factory "matinv.model:build"
    data/inverse.npz                  x_* (N, 9) float32 matrices, y_* (N, 9) float32 inverses
    runs/mlp/ckpt_{epoch}.pt          {"model": state_dict, "epoch"} from the user's own MSE loop

The data: A = I + 0.3·G (G standard normal, 3x3), kept when cond(A) < 6, so every inverse exists
and is well scaled.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

TEMPLATE = Path(__file__).parent / "template" / "matinv"


@dataclass
class RegressionProject:
    root: Path
    project_path: Path
    npz: Path
    ckpt_template: str  # runs/mlp/ckpt_{epoch}.pt
    epochs: list[int]
    states: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    factory: str = "matinv.model:build"
    kwargs: dict = field(default_factory=lambda: {"hidden": 16, "depth": 1})


def inverse_data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): n well-conditioned 3x3 matrices and their inverses, each flattened to 9 float32."""
    xs, ys = [], []
    while len(xs) < n:
        a = np.eye(3) + 0.3 * rng.standard_normal((3, 3))
        if np.linalg.cond(a) < 6:
            xs.append(a.ravel())
            ys.append(np.linalg.inv(a).ravel())
    return np.asarray(xs, np.float32), np.asarray(ys, np.float32)


def build_regression_project(
    root: str | Path,
    n_train: int = 160,
    n_test: int = 60,
    epochs: tuple[int, ...] = (0, 5, 20),
    seed: int = 0,
) -> RegressionProject:
    """Write the data, copy the model package and train it with the user's loop (Adam, MSE)."""
    import sys

    root = Path(root)
    code = root / "code"
    shutil.copytree(TEMPLATE, code / "matinv", dirs_exist_ok=True)
    rng = np.random.default_rng(seed)
    x_train, y_train = inverse_data(n_train, rng)
    x_test, y_test = inverse_data(n_test, rng)
    npz = root / "data" / "inverse.npz"
    npz.parent.mkdir(parents=True, exist_ok=True)
    np.savez(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    project = RegressionProject(root, code, npz, str(root / "runs" / "mlp" / "ckpt_{epoch}.pt"), list(epochs))
    sys.path.insert(0, str(code))
    try:
        from matinv.model import build
    finally:
        sys.path.remove(str(code))
        for name in [m for m in sys.modules if m == "matinv" or m.startswith("matinv.")]:
            del sys.modules[name]
    torch.manual_seed(seed)
    model = build(**project.kwargs)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.from_numpy(x_train), torch.from_numpy(y_train)
    out = Path(project.ckpt_template).parent
    out.mkdir(parents=True, exist_ok=True)
    for epoch in range(max(epochs) + 1):
        if epoch in epochs:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            project.states[epoch] = state
            torch.save({"model": state, "epoch": epoch}, project.ckpt_template.format(epoch=epoch))
        for batch in torch.randperm(len(x)).split(32):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            opt.step()
    return project
