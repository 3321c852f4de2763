"""A full disk through Snakemake (``benchmarks/faults.py --disk``, as root): the finished run of
:mod:`_faults_run` copied into a folder whose ``results/`` is a tmpfs; then, for one job of each rule
kind, its outputs are deleted, the tmpfs is filled with a ballast file that leaves half of what
the job wrote in the reference free, and the job is asked for (``snakemake <its output>``). It must
fail with the one-line error of ``epochlens.runner`` naming the file system, leave none of its
outputs and no temporary file; then the ballast is removed, the same command is run again, and
its outputs must equal the reference's (``benchmarks/compare_results.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from _faults_run import Invocation, files_under
from compare_results import compare_trees

FULL = "the file system is full"
_BLOCK = re.compile(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", re.M)
PAGE = 4096


@dataclass
class DiskOutcome:
    rule: str
    outputs: list[str]
    error: str  # the first line of the error a user reads
    partial: list[str]  # files of the job (outputs or temporary) left after the failure
    rerun_equal: bool
    detail: str = ""


def one_job_per_rule(log: str) -> dict[str, tuple[list[str], list[str]]]:
    """{rule: (outputs, logs) of its first job} from a Snakemake output (rules with outputs)."""
    jobs: dict[str, tuple[list[str], list[str]]] = {}
    for rule, body in _BLOCK.findall(log):
        out, logs = (re.search(rf"^    {key}: (.*)$", body, re.M) for key in ("output", "log"))
        if out and rule not in jobs:
            split = [[p.strip() for p in m.group(1).split(",")] if m else [] for m in (out, logs)]
            jobs[rule] = (split[0], split[1])
    return jobs


def mount_tmpfs(folder: Path, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)


def fill(folder: Path, leave: int) -> Path:
    """A ballast file in ``folder`` that leaves ``leave`` bytes free, rounded down to pages (none
    for a job that writes less than two pages)."""
    ballast = folder / "ballast.bin"
    free = shutil.disk_usage(folder).free
    with open(ballast, "wb") as f:
        left = free - leave // PAGE * PAGE
        chunk = b"\0" * (1 << 20)
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])
    return ballast


def size_of(work: Path, outputs: list[str]) -> int:
    total = 0
    for out in outputs:
        path = work / out
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        total += sum(p.stat().st_size for p in files if p.exists())
    return total


def remove(work: Path, outputs: list[str]) -> None:
    for out in outputs:
        path = work / out
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def first_error_line(text: str) -> str:
    """The full-disk message, else the first error line a user reads (not a rule's input list)."""
    lines = [line.strip() for line in text.splitlines() if not line.strip().startswith("input:")]
    for line in lines:
        if "a write failed" in line:
            return line[line.index("a write failed") :][:100]
    errors = [line for line in lines if re.search(r"Error|error:|Traceback|Killed|Signals", line)]
    return (errors[0] if errors else lines[-1] if lines else "(none)")[:100]


def disk_case(
    user: Invocation, reference: Path, rule: str, outputs: list[str], logs: list[str]
) -> DiskOutcome:
    """One job on a filling results file system, then its rerun once space is freed. Its old log
    goes too (a step truncates its log: the space freed would let a small job succeed)."""
    results = user.work / "results"
    wrote = size_of(reference.parent, outputs)
    remove(user.work, outputs + logs)
    before = files_under(results)
    ballast = fill(results, wrote // 2)
    try:
        failed = user.run(*outputs)
    finally:
        ballast.unlink()
    partial = sorted(files_under(results) - before)
    left = [p for p in partial if not re.search(r"(^|/)(logs|benchmarks|\.resume)/", p)]
    if failed.returncode == 0:
        error = "(none: the job succeeded)"
    else:
        error = first_error_line(failed.stdout)
    rerun = user.run(*outputs)
    _, problems, _ = compare_trees(reference, results, produced_only=True)
    equal = rerun.returncode == 0 and not problems
    detail = "" if equal else (rerun.stdout[-1500:] + "\n".join(problems[:10]))
    detail += "".join(f"\nleft after the failure: {p}" for p in left)
    if FULL not in error:
        detail += "\nwhat the user read:\n" + failed.stdout[-2500:]
    return DiskOutcome(rule, outputs, error, left, equal, detail)


def disk_run(reference_work: Path, reference_log: str, root: Path, rules=None) -> list[DiskOutcome]:
    """Every rule kind of the reference run (its folder and Snakemake output) on a filling tmpfs."""
    work = root / "disk"
    shutil.copytree(reference_work, work, symlinks=True, ignore=shutil.ignore_patterns("results"))
    size = size_of(reference_work, ["results"]) + (64 << 20)
    mount_tmpfs(work / "results", size)
    try:
        subprocess.run(["cp", "-a", f"{reference_work / 'results'}/.", str(work / "results")], check=True)
        cfg = sorted(reference_work.parent.glob("reference.yaml"))[0]
        user = Invocation(work, cfg)
        touched = user.run("--touch")  # a reference of an earlier commit: its results as they are
        if touched.returncode:
            raise RuntimeError(f"snakemake --touch failed:\n{touched.stdout[-2000:]}")
        jobs = one_job_per_rule(reference_log)
        picked = [rule for rule in jobs if not rules or rule in rules]
        return [disk_case(user, reference_work / "results", rule, *jobs[rule]) for rule in picked]
    finally:
        subprocess.run(["umount", str(work / "results")], check=False)


def disk_table(outcomes: list[DiskOutcome]) -> str:
    rows = [("rule kind", "error seen (first line)", "partial files", "rerun equal")]
    for o in outcomes:
        rows.append((o.rule, o.error, str(len(o.partial)), "yes" if o.rerun_equal else "NO"))
    # logs, benchmarks and a training's .resume/ state (kept by design, written atomically) are not
    # counted as partial files
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    full = sum(FULL in o.error for o in outcomes)
    summary = (
        f"{len(outcomes)} rule kinds: {full} failed with the full-disk error, "
        f"{sum(bool(o.partial) for o in outcomes)} left files, "
        f"{sum(not o.rerun_equal for o in outcomes)} reruns differ"
    )
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:], "-" * len(lines[0]), summary])
