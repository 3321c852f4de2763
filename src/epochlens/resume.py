"""Resume state of a long job: what a job killed at its wall time needs to continue where it was.

A cluster job that runs longer than its wall time is killed (SLURM: SIGTERM, then SIGKILL) and
Snakemake deletes the outputs of a failed job, finished checkpoints included. So a training job
keeps its resume state in a folder that is *not* one of the rule's outputs
(``results/{run}/index-{i}/.resume/train/``):

- ``state.pt``: model, optimizer, early-stopping state, the last finished epoch, every random
  number generator (torch CPU and CUDA, numpy, python, the job's own ``torch.Generator``), the
  rows of the train log so far, and a fingerprint of what the training depends on;
- ``checkpoints/``: the checkpoints written so far, hard links to the published files (no extra
  disk space; a copy where the file system has no hard links), so that they survive Snakemake's
  clean-up and are put back, byte for byte, when the job starts again.

Every file is replaced atomically, so a kill at any moment leaves the previous complete state. A
state whose fingerprint differs (other settings, data, class order, model or code) is discarded
with a warning and training starts from epoch 0. The folder is deleted when the job completes; a
``README.txt`` in it says it is safe to delete by hand once no job of that run is running.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from epochlens.atomic import atomic_path, link_or_copy, write_atomic

log = logging.getLogger("epochlens")

#: Bumped when the content of state.pt changes; a state of another version is not resumed.
STATE_VERSION = 1

README = """\
Resume state of a training job (epochlens.resume): the last finished epoch's model, optimizer,
random number generators and train log, and links to the checkpoints written so far.

A job killed at its wall time (or by anything else) continues from here when Snakemake runs it
again (profile `retries`, or a new `snakemake` call with --rerun-incomplete), and ends with the
same checkpoints, byte for byte, as a job that was never interrupted.

The job deletes this folder when it completes. Deleting it by hand is safe whenever no job of this
run and index is running; the next attempt then trains from epoch 0.
"""


def fingerprint(obj: Any) -> str:
    """SHA-256 of ``obj`` as canonical JSON (tuples as lists, numpy scalars and arrays as lists)."""

    def default(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return x.tolist()
        if isinstance(x, np.generic):
            return x.item()
        raise TypeError(f"cannot fingerprint {type(x).__name__}")

    text = json.dumps(obj, sort_keys=True, default=default, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def file_digest(*paths: str | Path) -> str:
    """SHA-256 over the contents of ``paths`` (e.g. the source files that define the training)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every random number generator a training job may draw from, as tensors and plain values
    (so that ``torch.load(weights_only=True)`` reads them back)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss],
    }
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def set_rng_state(state: Mapping[str, Any], generator: torch.Generator | None = None) -> None:
    """Restore what :func:`rng_state` captured (CUDA generators only where the devices match)."""
    torch.set_rng_state(state["torch"])
    cuda = list(state.get("cuda", []))
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    elif cuda:
        log.warning(
            "resume: the state was saved with %d CUDA device(s), this job has %d; CUDA random "
            "numbers (dropout or augmentation on the GPU) will differ from an uninterrupted run",
            len(cuda),
            torch.cuda.device_count() if torch.cuda.is_available() else 0,
        )
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if generator is not None:
        generator.set_state(state["generator"])


class ResumeDir:
    """The resume folder of one job: ``state.pt``, ``checkpoints/`` and ``README.txt``.

    Args:
        folder: where the state lives; outside the rule's outputs (Snakemake deletes those when a
            job fails), e.g. ``results/{run}/index-{i}/.resume/train``.
        key: fingerprint of everything the job's results depend on (see :func:`fingerprint`); a
            state saved under another key is not resumed.
    """

    def __init__(self, folder: str | Path, key: str) -> None:
        self.folder = Path(folder)
        self.key = key
        self.state_path = self.folder / "state.pt"
        self.checkpoint_dir = self.folder / "checkpoints"

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is none or it cannot be resumed (said in the log;
        an unusable state is deleted so that it cannot be mistaken for this job's later)."""
        if not self.state_path.is_file():
            return None
        try:
            state = torch.load(self.state_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated, corrupt, or written by an incompatible torch
            log.warning(
                "%s: cannot read the resume state (%s: %s); training starts from epoch 0",
                self.state_path,
                type(exc).__name__,
                str(exc)[:200],
            )
            self.clear()
            return None
        if state.get("version") != STATE_VERSION or state.get("key") != self.key:
            log.warning(
                "%s: resume state of other settings, data, model or code; discarded, training "
                "starts from epoch 0",
                self.state_path,
            )
            self.clear()
            return None
        missing = [
            e for e, name in state["checkpoints"].items() if not (self.checkpoint_dir / name).is_file()
        ]
        if missing:
            log.warning(
                "%s: the checkpoints of epochs %s are gone from %s; training starts from epoch 0",
                self.state_path,
                missing,
                self.checkpoint_dir,
            )
            self.clear()
            return None
        return state

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` (plus version and key) atomically."""
        self.folder.mkdir(parents=True, exist_ok=True)
        readme = self.folder / "README.txt"
        if not readme.is_file():
            write_atomic(readme, lambda p: p.write_text(README))
        with atomic_path(self.state_path) as tmp:
            torch.save({**state, "version": STATE_VERSION, "key": self.key}, tmp)

    def keep(self, published: str | Path) -> str:
        """Keep a published file (e.g. a checkpoint just written) in ``checkpoints/``; return the
        name to list in the state."""
        published = Path(published)
        link_or_copy(published, self.checkpoint_dir / published.name)
        return published.name

    def restore(self, name: str, published: str | Path) -> None:
        """Put a kept file back at its published path (the job's clean-up may have deleted it)."""
        link_or_copy(self.checkpoint_dir / name, published)

    def clear(self) -> None:
        """Delete the folder (see :func:`clear`)."""
        clear(self.folder)


def clear(folder: str | Path) -> None:
    """Delete a resume folder once its job's outputs are all written (and its parent ``.resume``
    when that is left empty). Published files that were hard links stay."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    parent = folder.parent
    if parent.name == ".resume" and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
