"""Running a training command: one attempt with its output streamed line by line to the job's log
(:func:`run_streamed`), the resume folders kept across attempts (:func:`prepare_attempt`), the
training subset it is given (:func:`write_subset`) and the checkpoints it wrote, collected into the
run's layout (:func:`collect_checkpoints`). Torch-free. See :mod:`epochlens.formats.command`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from epochlens.atomic import link_or_copy, save_npy
from epochlens.formats.command_spec import CommandError, CommandSpec

#: Lines of the command's output kept for an error message.
TAIL_LINES = 30


@dataclass
class CommandResult:
    """How a command ended: exit status (negative: killed by that signal), seconds, the last lines
    of its output."""

    returncode: int
    seconds: float
    tail: list[str]

    @property
    def status(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"was killed by {name}"
        return f"exited with status {self.returncode}"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the command gets SIGKILL when the job's process dies (a job killed alone must not
    leave a training running beside its retry)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_streamed(
    command: str,
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
    tail: int = TAIL_LINES,
    redraw_every: float = 10.0,
) -> CommandResult:
    """Run ``command`` in a shell (bash where there is one) and copy its output (stdout and stderr
    merged) to ``stream`` line by line as it comes, so that ``tail -f`` on the job's log follows
    it. A carriage-return redraw (a progress bar) is copied at most every ``redraw_every`` seconds.

    ``env`` adds to the environment (PYTHONUNBUFFERED=1 is set, so Python scripts print at once).
    """
    stream = stream if stream is not None else sys.stderr
    shell = shutil.which("bash") or "/bin/sh"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    start = time.monotonic()
    last: deque[str] = deque(maxlen=tail)
    proc = subprocess.Popen(
        [shell, "-c", command],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    assert proc.stdout is not None
    pending = b""
    last_redraw = float("-inf")

    def emit(raw: bytes) -> None:
        text = raw.decode(errors="replace").rstrip()
        last.append(text if len(text) <= 500 else text[:500] + " ...")
        stream.write(text + "\n")
        stream.flush()

    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            pending += chunk
            while True:
                match = re.search(rb"[\r\n]", pending)
                if match is None:
                    break
                end = match.start()
                piece, sep = pending[:end], pending[end : end + 1]
                pending = pending[end + 1 :]
                if sep == b"\r":
                    if pending.startswith(b"\n"):  # \r\n: an ordinary line end
                        pending = pending[1:]
                    elif not piece.strip() or time.monotonic() - last_redraw < redraw_every:
                        continue
                    else:
                        last_redraw = time.monotonic()
                if piece.strip() or sep == b"\n":
                    emit(piece)
        if pending:
            emit(pending)
    finally:
        proc.stdout.close()
        returncode = proc.wait()
    return CommandResult(returncode, time.monotonic() - start, list(last))


def failure_message(
    spec: CommandSpec,
    index: int,
    command: str,
    result: CommandResult,
    log: str | None,
    resume: str,
    what: str | None = None,
) -> str:
    """The error of a command that did not exit 0: status, command, the tail of its output
    (``what`` names the run of it, default ``index {index}``)."""
    lines = [
        f"{spec.key}.command ({what or f'index {index}'}) {result.status} after {result.seconds:.1f} s:",
        f"  {command}",
        f"Its last {len(result.tail)} line(s) of output" + (f" (all of it: {log}):" if log else ":"),
    ]
    lines += [f"  | {line}" for line in result.tail] or ["  (no output)"]
    lines.append(
        f"The resume folder {resume} is kept: the next attempt (the profile's retries, or snakemake "
        "run again) continues from what the command saved there. Fix the command or the script, "
        "commit, and run snakemake again."
    )
    return "\n".join(lines)


def fingerprint(obj: Any) -> str:
    """SHA-256 of ``obj`` as canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def file_digests(paths: Iterable[str | Path], root: str | Path | None = None) -> dict[str, str]:
    """{path (relative to ``root`` where inside it): sha256} of files."""
    digests = {}
    for path in paths:
        path = Path(path)
        name = str(path)
        if root is not None:
            with contextlib.suppress(ValueError):
                name = path.resolve().relative_to(Path(root).resolve()).as_posix()
        digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def prepare_attempt(state_file: str | Path, folders: Sequence[str | Path], key: str) -> bool:
    """Start an attempt of a job whose ``folders`` (``{output}``, ``{resume}``) survive failed
    attempts: keep them when ``state_file`` says they were made for ``key`` (the same command,
    files and data), else empty them and record ``key``. Returns whether they were kept."""
    state_file = Path(state_file)
    try:
        kept = json.loads(state_file.read_text()).get("key") == key
    except (OSError, ValueError, AttributeError):
        kept = False
    if not kept:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    for folder in folders:
        Path(folder).mkdir(parents=True, exist_ok=True)
    if not kept:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_file.with_name(f".{state_file.name}.tmp")
        tmp.write_text(json.dumps({"key": key}) + "\n")
        os.replace(tmp, state_file)
    return kept


def training_positions(holdout: Sequence[bool]) -> np.ndarray:
    """``{subset}`` of the run's own training: every position of ``{data}``'s x_train that the
    holdout does not hold out, int64, ascending (so a script that trains on ``x_train[subset]``
    trains on the same samples, in the same order, as one that drops the holdout)."""
    return np.flatnonzero(~np.asarray(holdout, dtype=bool)).astype(np.int64)


def write_subset(path: str | Path, positions: Sequence[int]) -> Path:
    """Write a ``{subset}`` file: int64 positions in ``{data}``'s x_train, one dimension,
    atomically; returns its absolute path."""

    save_npy(path, np.asarray(positions, dtype=np.int64).reshape(-1))
    return Path(path).resolve()


def collect_checkpoints(
    spec: CommandSpec, index: int, output: str | Path, destinations: Mapping[int, str | Path]
) -> dict[int, Path]:
    """Put the checkpoint the command wrote for each epoch (``spec.path`` under ``output``) at its
    destination (the run's layout), each atomically: a hard link, so the files stay in ``output``
    until the job has finished. Every checkpoint missing is an error naming it, the template and
    what the folder holds. Returns {epoch: destination}."""
    expected = written_checkpoints(spec, index, output, destinations)
    for epoch, src in expected.items():
        link_or_copy(src, Path(destinations[epoch]))
    return {e: Path(destinations[e]) for e in expected}


def written_checkpoints(
    spec: CommandSpec, index: int, output: str | Path, epochs: Iterable[int], what: str | None = None
) -> dict[int, Path]:
    """{epoch: the file the command wrote for it under ``output``} for each of ``epochs``; every
    one missing is an error naming it, the template and what the folder holds (``what`` names the
    run of the command, default ``index {index}``)."""
    output = Path(output)
    expected = {int(e): output / spec.checkpoint_name(index, e) for e in epochs}
    missing = {e: p for e, p in expected.items() if not p.is_file()}
    if missing:
        present = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
        listed = ", ".join(present[:20]) + (f", ... ({len(present)} files)" if len(present) > 20 else "")
        raise CommandError(
            f"{spec.key}.command ({what or f'index {index}'}) exited 0 but did not write "
            f"{len(missing)} of the {len(expected)} checkpoints that runs.{spec.run}.epochs lists: "
            + ", ".join(f"{p.relative_to(output)} (epoch {e})" for e, p in sorted(missing.items()))
            + f".\nIts output folder {output} holds: {listed or 'nothing'}.\n"
            f"Fix: make the command save the checkpoint of each epoch in {sorted(expected)} as "
            f"{{output}}/{spec.path} ({spec.key}.path, relative to the folder passed as {{output}}), "
            f"or correct {spec.key}.path or runs.{spec.run}.epochs."
        )
    return expected


def keep_other_files(output: str | Path, exclude: Iterable[str | Path], dest: str | Path) -> list[str]:
    """Put what else the command wrote into ``output`` (metrics, logs) under ``dest``, each file
    atomically (a hard link, as :func:`collect_checkpoints`); return the names (relative to
    ``output``)."""
    output, dest = Path(output), Path(dest)
    skip = {Path(p).resolve() for p in exclude}
    kept = []
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(output.rglob("*")):
        if path.is_file() and path.resolve() not in skip:
            rel = path.relative_to(output)
            link_or_copy(path, dest / rel)
            kept.append(rel.as_posix())
    return kept
