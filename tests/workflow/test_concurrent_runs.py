"""Two invocations at once on one results folder, and a reader while a run writes (issue 33).

A tiny run's data and evaluation are rebuilt (--forcerun) by one Snakemake while a second
``snakemake`` is started on the same folder, and while a reader polls the files being rewritten:

* the second is stopped by Snakemake's lock, with its message and the way out (--unlock);
* the reader only ever sees each file absent (Snakemake removes a job's old outputs before it
  runs) or complete: dataset.h5 opens with all its arrays, every evaluation table parses with all
  its rows (the library writes each result to a temporary file and renames it, epochlens.atomic).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pandas as pd
import pytest
from wfutil import TINY_EPOCHS, snakemake, tiny_run

from epochlens.layout import Layout

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


class Reader(threading.Thread):
    """Reads ``files`` in a loop until stopped; records what it saw of each: absent, complete, or
    the error a half-written file gave."""

    def __init__(self, files: list[Path]) -> None:
        super().__init__(daemon=True)
        self.files, self.stop = files, threading.Event()
        self.seen: dict[Path, list[str]] = {f: [] for f in files}

    def run(self) -> None:
        while not self.stop.is_set():
            for path in self.files:
                self.seen[path].append(read(path))

    def transitions(self, path: Path) -> int:
        marks = self.seen[path]
        return sum(a != b for a, b in zip(marks, marks[1:], strict=False))


def read(path: Path) -> str:
    """'absent', 'complete', or what failed."""
    try:
        if path.suffix == ".h5":
            with h5py.File(path, "r") as f:
                n = len(f["train/labels"][:]) + len(f["test/labels"][:])
            return "complete" if n else "empty"
        table = pd.read_csv(path)
        return "complete" if len(table) and "accuracy" in "".join(table.columns) else f"partial {table.shape}"
    except FileNotFoundError:
        return "absent"
    except Exception as exc:  # a half-written file
        # HDF5 lstat()s the name after opening it: a file unlinked in between (Snakemake removing
        # the old output) fails there, whole until it vanished (seen once in CI)
        if isinstance(exc, OSError) and "can't retrieve stat info" in str(exc):
            return "absent"
        return f"{type(exc).__name__}: {exc}"


def test_a_second_snakemake_is_locked_out_and_readers_see_only_whole_files(tmp_path):
    run = tiny_run(tmp_path, None, run=False)
    paths = Layout(run.work / "results")
    tables = [Layout("results").eval_table("tiny", 0, e) for e in TINY_EPOCHS[:2]]
    snakemake(run.wf, run.work, *tables, configfile=run.cfg)  # the finished files to rewrite
    watched = [Path(paths.dataset("tiny"))] + [run.work / t for t in tables]
    reader = Reader(watched)
    reader.start()
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(run.wf / "Snakefile")]
    # the targets before --forcerun, whose list would take them as rules (and rebuild everything)
    command += ["--directory", str(run.work), "--cores", "1", *tables, "--forcerun", "prepare_data"]
    first = subprocess.Popen(
        [*command, "--configfile", str(run.cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        locks = run.work / ".snakemake" / "locks"
        deadline = time.monotonic() + 120
        while not any(locks.glob("*.lock")) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, "the first run ended before it could be raced"
        second = snakemake(run.wf, run.work, *tables, configfile=run.cfg, check=False)
        assert first.poll() is None, "the first run ended before the second asked: the test proves nothing"
    finally:
        out, _ = first.communicate(timeout=600)
        reader.stop.set()
        reader.join()
    assert first.returncode == 0, out[-3000:]
    assert second.returncode != 0
    locked = second.stdout
    assert "Directory cannot be locked" in locked and "--unlock" in locked, locked[-2000:]
    for path in watched:
        assert set(reader.seen[path]) <= {"absent", "complete"}, (path, set(reader.seen[path]))
        assert reader.transitions(path) >= 2, (path, "the reader did not see the file rewritten")
    assert not list(run.work.rglob(".*.tmp")), "a temporary file was left behind"
