"""Reading and writing model checkpoints in the loss-of-plasticity format: a bare state_dict.

Users' files were saved from CUDA and sometimes from ``nn.DataParallel`` (keys prefixed
``module.``); both load here on any device. Every failure names the file and what to do.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from epochlens.atomic import atomic_path
from epochlens.errors import CheckpointError

# Wrappers other training scripts put around the state_dict.
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model_weights", "model")


def save_state_dict(model: nn.Module, path: str | Path) -> None:
    """Save ``model.state_dict()`` (on the CPU) atomically, as the original experiment does."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        # Through a file object: given a path, torch.save names the archive's top folder after
        # the (random) temporary file name, and identical weights would give different bytes.
        with open(tmp, "wb") as f:
            torch.save(state, f)
        torch.load(tmp, map_location="cpu", weights_only=True)  # verify before publishing


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a state_dict from ``path`` onto the CPU, unwrapping common containers and ``module.``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"{path}: checkpoint not found. Check checkpoints.path in the config (placeholders "
            "{index} and {epoch}) or train the run first."
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
        raise CheckpointError(
            f"{path}: cannot read the checkpoint ({type(exc).__name__}: {str(exc)[:200]}). The file "
            "is truncated or corrupt: copy it again from the training run, or delete it and rerun "
            "training for this epoch."
        ) from exc
    except Exception as exc:  # unpickling of non-tensor objects under weights_only
        raise CheckpointError(
            f"{path}: not a bare state_dict of tensors ({type(exc).__name__}: {str(exc)[:200]}). "
            "Save checkpoints with torch.save(model.state_dict(), path)."
        ) from exc
    if isinstance(obj, Mapping):
        for key in _WRAPPER_KEYS:
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(
            f"{path}: expected a state_dict (name -> tensor), got {type(obj).__name__}. Save "
            "checkpoints with torch.save(model.state_dict(), path)."
        )
    state = dict(obj)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def load_into(model: nn.Module, path: str | Path) -> nn.Module:
    """Load the checkpoint at ``path`` into ``model``; mismatches are listed by key."""
    state = load_state_dict(path)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_short(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches {_short(shapes)}")
        raise CheckpointError(
            f"{path}: the state_dict does not fit model {type(model).__name__} ("
            + "; ".join(parts)
            + "). Set model.name (and the data set, which fixes the number of classes) in the "
            "config to the architecture that wrote this checkpoint."
        )
    check_finite(state, path)
    model.load_state_dict(state)
    return model


def _short(items: list[str], n: int = 6) -> str:
    return str(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors that hold NaN or Inf."""
    return [k for k, v in named if v.is_floating_point() and not bool(torch.isfinite(v.detach()).all())]


def check_finite(state: Mapping[str, torch.Tensor], source: str | Path) -> None:
    """CheckpointError naming the tensors of ``state`` with NaN or Inf values: every result of such
    a model (losses, curvature, influence) would be NaN or a wrong number without a word."""
    bad = nonfinite(state.items())
    if bad:
        raise CheckpointError(
            f"{source}: {len(bad)} tensor(s) hold NaN or Inf values ({_short(bad)}): the training "
            "diverged before this checkpoint was saved, or the file was written wrongly. Leave this "
            "epoch out (epochs: in the config) or replace the file."
        )
