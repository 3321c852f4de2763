"""Kill anywhere (``benchmarks/faults.py --kill``): the run of :mod:`_faults_run`, once
uninterrupted (the reference), then again in a fresh folder whose Snakemake is SIGKILLed, process
group and all (its jobs with it: a lost node or login session), at K seeded random moments; after
each kill only what the docs tell a user (docs/guides/slurm.md): run the same command again, after
``snakemake --unlock`` when it says the directory is locked (the workflow's default profile has
``rerun-incomplete``). At the end every output is compared with the reference
(``benchmarks/compare_results.py``).

The kills are paced by the run's progress: before each attempt a dry run says how many jobs are
left (J) and which rules have them, and with k kills left the kill waits for the attempt's
round(J / (k + 1))-th job start, or for a later one (up to twice as many) of a rule no kill has hit
yet, then SIGKILLs after a seeded delay uniform in 0..half that rule's median job time in the
reference (at most 8 s). So every kill finds work left and the kills spread over the whole run;
the jobs running at each moment are the rules hit.
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from _faults_run import Invocation, new_workdir, running_jobs, started_jobs
from compare_results import compare_trees
from wfutil import job_stats

LOCKED = "Directory cannot be locked"


@dataclass
class Attempt:
    """One ``snakemake`` of the user's: killed at ``moment`` s (from the start of the job it waited
    for) with ``running`` jobs, or ended by itself with ``returncode``."""

    moment: float | None
    running: list[str] = field(default_factory=list)
    returncode: int | None = None
    log: str = field(repr=False, default="")

    @property
    def locked(self) -> bool:
        return self.returncode not in (None, 0) and LOCKED in self.log


@dataclass(frozen=True)
class KillAt:
    """Kill ``delay`` s after a job of ``rules`` (any, if empty) is seen started."""

    rules: frozenset[str]
    delay: float

    def waits_for(self, started: list[str]) -> str | None:
        return next((rule for rule in started if not self.rules or rule in self.rules), None)

    def delay_for(self, rule: str) -> float:
        return self.delay


@dataclass(frozen=True)
class PacedKill:
    """The benchmark's kill: after the attempt's ``after``-th job start, at the first job of a rule
    in ``prefer`` (up to the ``2 x after``-th start, else that one), ``fraction`` of half that rule's
    median job time later (``seconds``; at most 8 s)."""

    fraction: float
    after: int = 1
    prefer: frozenset[str] = frozenset()
    seconds: dict[str, float] = field(default_factory=dict)

    def waits_for(self, started: list[str]) -> str | None:
        last = 2 * self.after if self.prefer else self.after
        for n, rule in enumerate(started, start=1):
            if n >= last or (n >= self.after and rule in self.prefer):
                return rule
        return None

    def delay_for(self, rule: str) -> float:
        return round(self.fraction * min(8.0, self.seconds.get(rule, 16.0) / 2), 2)


def job_started(log: Path, proc: subprocess.Popen, kill: KillAt | PacedKill) -> tuple[float, str] | None:
    """Wait until the job ``kill`` waits for runs: (that time, its rule), or None if Snakemake ended."""
    while proc.poll() is None:
        started = started_jobs(log.read_text(errors="replace")) if log.exists() else []
        if (rule := kill.waits_for([r for r in started if r != "all"])) is not None:
            return time.monotonic(), rule
        time.sleep(0.05)
    return None


def attempt(user: Invocation, kill: KillAt | PacedKill | None, log: Path) -> Attempt:
    """Run the user's command; SIGKILL its process group as ``kill`` says (never with None)."""
    with open(log, "w") as out:  # its own process group, killed with its jobs
        proc = subprocess.Popen(
            user.command(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    started = job_started(log, proc, kill) if kill is not None else None
    if started is not None:
        at, rule = started
        while proc.poll() is None and time.monotonic() - at < kill.delay_for(rule):
            time.sleep(0.02)
        if proc.poll() is None:
            running = running_jobs(log.read_text(errors="replace"))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            moment = round(time.monotonic() - at, 2)
            return Attempt(moment, running, log=log.read_text(errors="replace"))
    proc.wait()
    return Attempt(None, returncode=proc.returncode, log=log.read_text(errors="replace"))


@dataclass
class KillReport:
    kills: list[Attempt] = field(default_factory=list)
    steps: Counter = field(default_factory=Counter)  # what the user did: rerun, unlock, ...
    failures: list[str] = field(default_factory=list)  # attempts that ended in an error
    reference_seconds: float = 0.0
    reference_rules: Counter = field(default_factory=Counter)
    compared: Counter = field(default_factory=Counter)
    differences: list[str] = field(default_factory=list)
    missed: int = 0  # kills planned but not made: the run completed first
    rule_seconds: dict[str, float] = field(default_factory=dict)  # median job time per rule


def user_runs(user: Invocation, plan: list[KillAt | PacedKill], logs: Path, report: KillReport) -> None:
    """The user's command once per kill of ``plan``, then until it completes; ``--unlock`` when locked."""
    pending, aimed = list(plan), None
    for n in range(3 * len(plan) + 20):
        if aimed is None and pending:  # (after an attempt stopped by the lock, the same kill)
            aimed = pace(pending[0], report, user, len(pending))
            if aimed is None:  # nothing left to run but `all`: the next attempt completes
                report.missed, pending = len(pending), []
        a = attempt(user, aimed, logs / f"attempt-{n:03d}.log")
        report.steps["rerun the same command"] += 1
        if a.locked:  # it ran nothing: the kill made for it still holds
            unlock = user.run("--unlock")
            report.steps["snakemake --unlock (it said: locked)"] += 1
            if unlock.returncode:
                report.failures.append(f"--unlock failed:\n{unlock.stdout[-2000:]}")
            continue
        aimed = None
        if a.moment is not None:
            report.kills.append(a)
            pending.pop(0)
            continue
        if a.returncode != 0:
            report.failures.append(f"attempt {n} failed (exit {a.returncode}):\n{a.log[-3000:]}")
            continue
        report.missed += len(pending)
        return
    report.failures.append("the run did not complete")


def pace(kill: KillAt | PacedKill, report: KillReport, user: Invocation, kills_left: int):
    """``kill`` paced by the jobs left (a dry run's; None if none is left; a KillAt as it is)."""
    if isinstance(kill, KillAt):
        return kill
    out = user.run("--dry-run").stdout
    left = {r: n for r, n in job_stats(out).items() if r != "all"} if "Job stats:" in out else {}
    if not left:
        return None
    hit = {rule for a in report.kills for rule in a.running}
    after = max(1, round(sum(left.values()) / (kills_left + 1)))
    return PacedKill(kill.fraction, after, frozenset(left) - hit, report.rule_seconds)


def reference_run(user: Invocation, log: Path, report: KillReport) -> None:
    """The run never interrupted: its duration and its jobs per rule into ``report``."""
    start = time.monotonic()
    a = attempt(user, None, log)
    report.reference_seconds = time.monotonic() - start
    if a.returncode != 0:
        raise RuntimeError(f"the reference run failed:\n{a.log[-4000:]}")
    read_reference(a.log, report)


def killed_run(
    user: Invocation,
    reference: Path,
    plan: list[KillAt | PacedKill],
    logs: Path,
    report: KillReport,
    only_produced: bool = False,
) -> None:
    """The user's runs killed as ``plan`` says, then compared with the ``reference`` results
    (``only_produced``: the files of the user's targets only)."""
    logs.mkdir(parents=True, exist_ok=True)
    user_runs(user, plan, logs, report)
    left = user.run("--dry-run")
    if "Nothing to be done" not in left.stdout:
        report.failures.append(f"after the last run, jobs are still planned:\n{left.stdout[-2000:]}")
    # a temporary left behind is a file only the killed run has: a difference
    report.compared, report.differences, _ = compare_trees(reference, user.work / "results", only_produced)


def kill_run(root: Path, snapshots: Path, kills: int, seed: int, reference: Path | None = None) -> KillReport:
    """The reference run (or that of an earlier ``--keep`` folder ``reference``), then the killed
    one, in ``root``."""
    report = KillReport()
    if reference is None:
        ref = new_workdir(root, "reference", snapshots)
        reference_run(ref, root / "reference.log", report)
        reference = root
    else:
        log = (reference / "reference.log").read_text()
        read_reference(log, report)
        report.reference_seconds = log_seconds(log)
    rng = random.Random(seed)  # each kill's delay: a seeded fraction (pace() paces them at run time)
    plan = [PacedKill(rng.uniform(0, 1)) for _ in range(kills)]
    user = new_workdir(root, "killed", snapshots)
    killed_run(user, reference / "reference" / "results", plan, root / "attempts", report)
    return report


def read_reference(log: str, report: KillReport) -> None:
    """The reference run's jobs per rule and median job time (time stamps: whole seconds)."""
    report.reference_rules = Counter(started_jobs(log))
    report.rule_seconds = job_seconds(log)


def job_seconds(log: str) -> dict[str, float]:
    """{rule: median seconds from a job's start to its end} of a Snakemake output."""
    now, started, times = None, {}, {}
    for line in log.splitlines():
        if stamp := _STAMP.match(line):
            now = datetime.strptime(stamp.group(1), "%a %b %d %H:%M:%S %Y")
        elif (rule := _RULE.match(line)) and now is not None:
            started["pending"] = (rule.group(1), now)
        elif (job := _JOBID.match(line)) and "pending" in started:
            started[job.group(1)] = started.pop("pending")
        elif (done := _DONE.match(line)) and done.group(1) in started:
            rule, t0 = started.pop(done.group(1))
            times.setdefault(rule, []).append((now - t0).total_seconds())
    return {rule: float(statistics.median(t)) for rule, t in times.items()}


_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")
_RULE = re.compile(r"^(?:local)?rule (\w+):$")
_JOBID = re.compile(r"^    jobid: (\d+)$")
_DONE = re.compile(r"^Finished jobid: (\d+) ")


def log_seconds(log: str) -> float:
    """Seconds from the first to the last time stamp of a Snakemake output."""
    stamps = [m.group(1) for m in map(_STAMP.match, log.splitlines()) if m]
    first, last = (datetime.strptime(s, "%a %b %d %H:%M:%S %Y") for s in (stamps[0], stamps[-1]))
    return (last - first).total_seconds()


def kill_table(report: KillReport) -> str:
    hit = Counter(rule for a in report.kills for rule in a.running)
    rules = sorted(set(report.reference_rules) | set(hit))
    lines = [
        f"kills made: {len(report.kills)}  (reference run: {report.reference_seconds:.0f} s, "
        f"{sum(report.reference_rules.values())} jobs); planned but not made (the run completed "
        f"first): {report.missed}",
        "",
        f"{'rule':<24}{'jobs':>6}{'killed':>8}",
        "-" * 38,
        *(f"{r:<24}{report.reference_rules[r]:>6}{hit[r]:>8}" for r in rules),
        "-" * 38,
        f"rule kinds hit: {sum(1 for r in rules if hit[r])} of {len(rules)}; "
        f"kills between jobs: {sum(1 for a in report.kills if not a.running)}",
        "",
        "what the user did: " + ", ".join(f"{v} x {k}" for k, v in report.steps.items()),
        f"runs that ended in an error: {len(report.failures)}",
        "outputs compared: "
        + ", ".join(f"{v} {k}" for k, v in sorted(report.compared.items()))
        + f" ({sum(report.compared.values())})",
        f"differences: {len(report.differences)}",
    ]
    return "\n".join(lines)
