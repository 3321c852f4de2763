"""One replicate's training by the user's own command (``checkpoints.source: command``): pinned to
the commit its run was planned at, resumable, its output streamed into the job's log, its
checkpoints put into the run's layout, and its record (``train_metadata.json``). The command's
machinery (template, pinning, streaming, collecting) is :mod:`epochlens.formats.command`.
"""

from __future__ import annotations

import logging
import platform
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epochlens.formats import command as cmd
from epochlens.layout import RESULTS
from epochlens.provenance import config_hash, file_sha256, provenance

log = logging.getLogger("epochlens")


@dataclass
class CommandTraining:
    """The files and settings of one training job of a command run."""

    run_name: str
    run: Mapping[str, Any]  # the run's config section
    params: Mapping[str, Any]  # the job's command params (template, files, epochs, ...)
    index: int
    files: list[Path]  # the command's files (inputs, pinned)
    data: Path | None  # the {data} export, when the command uses it
    checkpoints: Sequence[str]  # the layout's checkpoint files, in the order of params["epochs"]
    train_output: str  # where the command's other files go
    threads: int = 1
    log_file: str | None = None


def train_by_command(job: CommandTraining) -> dict[str, Any]:
    """Run the command for the job's index and publish its checkpoints; returns the metadata to
    record; once it is written, :func:`forget_attempts` removes the resume folders. Raises
    CommandError with the tail of its log when it fails or writes no checkpoint."""
    spec = cmd.CommandSpec.from_config(job.run_name, job.run)
    seed = cmd.seed_of(job.run, job.index)
    state = cmd.job_repository_state(spec, job.files)  # still the planned commit, nothing uncommitted
    # {output} and {resume} survive failed attempts (outside the job's outputs, which Snakemake
    # deletes), unless they were made for another command, other files or other data.
    output = Path(RESULTS.command_output(job.run_name, job.index)).resolve()
    resume = Path(RESULTS.resume_dir(job.run_name, job.index)).resolve()
    inputs = cmd.file_digests(job.files, state.root)
    if job.data is not None:
        inputs["{data}"] = file_sha256(job.data)
    key = cmd.fingerprint({"params": job.params, "index": job.index, "seed": seed, "inputs": inputs})
    resumed = cmd.prepare_attempt(RESULTS.command_state(job.run_name, job.index), [output, resume], key)
    values = {
        "index": job.index,
        "seed": seed,
        "output": output,
        "resume": resume,
        "data": job.data.resolve() if job.data is not None else "",
        "threads": job.threads,
    }
    positions = None
    if spec.uses_subset:  # the run's own training: every position of {data}'s x_train but the holdout
        with np.load(job.data) as data:
            holdout = data["holdout"]
        positions = cmd.training_positions(holdout)
        values["subset"] = cmd.write_subset(RESULTS.command_subset(job.run_name, job.index), positions)
        log.info(
            "index %d: {subset} lists %d of %d training samples", job.index, len(positions), len(holdout)
        )
    line = cmd.fill_command(spec.command, values)
    what = "resuming (the command's {resume} and {output} folders of an earlier attempt are kept)"
    log.info(
        "index %d: %s at commit %s%s: %s",
        job.index, what if resumed else "training", state.commit, " (dirty)" if state.dirty else "", line,
    )  # fmt: skip
    found = python_on_path(line)
    if found:
        log.info("index %d: %s", job.index, found)
    started = time.time()
    result = cmd.run_streamed(line)
    if result.returncode != 0:
        raise cmd.CommandError(cmd.failure_message(spec, job.index, line, result, job.log_file, resume))
    epochs = [int(e) for e in job.params["epochs"]]
    published = cmd.collect_checkpoints(
        spec, job.index, output, dict(zip(epochs, job.checkpoints, strict=True))
    )
    written = [output / spec.checkpoint_name(job.index, e) for e in epochs]
    others = cmd.keep_other_files(output, written, job.train_output)
    log.info("index %d: %d checkpoints in %s", job.index, len(published), Path(job.checkpoints[0]).parent)
    return {
        "index": job.index,
        "seed": seed,
        "command": line,
        "command_template": spec.command,
        "git": state.record(),
        "config_hash": config_hash(job.params),
        "exit_status": result.returncode,
        "duration_seconds": round(result.seconds, 3),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "resumed": resumed,
        "host": platform.node(),
        "checkpoints": {str(e): file_sha256(p) for e, p in published.items()},
        "train_output": others,
        **({"subset_samples": len(positions)} if positions is not None else {}),
        "provenance": provenance(job.params, inputs),
    }


def forget_attempts(run_name: str, index: int) -> None:
    """Remove the ``.resume/`` folder of a finished training (its {output}, {resume}, {subset})."""
    shutil.rmtree(Path(RESULTS.command_state(run_name, index)).parent, ignore_errors=True)


def python_on_path(line: str) -> str | None:
    """Which ``python`` a command line that says ``python`` (or ``python3``) will run: the first on
    the PATH of the shell that started snakemake, not necessarily the pipeline's own (with
    ``.venv/bin/snakemake`` and no activated environment, a system python without torch); None
    when the line names no bare python."""
    names = sorted(set(re.findall(r"(?:^|[\s;&|(])(python3?)(?=\s|$)", line)))
    if not names:
        return None
    found = {name: shutil.which(name) for name in names}
    own = Path(sys.executable).absolute().parent  # an environment's bin folder (links not followed:
    # a venv's python links to the system's)
    other = [n for n, path in found.items() if path is None or Path(path).absolute().parent != own]
    says = ", ".join(f"{n} is {path or 'not on the PATH'}" for n, path in found.items())
    if not other:
        return f"the command's {says} (the pipeline's own python)"
    return (
        f"the command's {says} (the PATH of the shell that started snakemake), not the pipeline's "
        f"own {sys.executable}: if the script needs its packages (torch), write that path in "
        "checkpoints.command, or activate the environment before running snakemake"
    )
