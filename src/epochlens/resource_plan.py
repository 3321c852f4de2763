"""What each rule's jobs ask for under a profile (``epochlens doctor --profile``): memory and
time, where each is set, and what the rules sized from the run ask for at the runs prepared in
the folder (epochlens.memory, epochlens.job_time). Torch-free."""

from __future__ import annotations

from epochlens import job_time, memory
from epochlens.rule_devices import PER_JOB, resource


def memory_plan(rules, profile, config) -> str:
    """Where each rule's mem_mb comes from under ``profile``, and what the rules that size it
    from the run ask for at the runs prepared in this folder (epochlens.memory)."""
    title = "Memory per job (mem_mb, MB, first attempt; x attempt when retried)"
    sized = _sources(rules, profile, "mem_mb")
    return _table(title, sized, memory.run_shapes(config), memory.mem_mb, memory.describe)


def time_plan(rules, profile, config) -> str:
    """The same for runtime (epochlens.job_time), at one checkpoint and one shard."""
    title = "Time per job (runtime, minutes, first attempt, a checkpoint and a shard; x attempt when retried)"
    sized = _sources(rules, profile, "runtime")
    return _table(title, sized, memory.run_shapes(config), job_time.minutes, job_time.describe)


def _table(title: str, rules: dict, shapes: dict, value, describe) -> str:
    """``rules`` maps a rule to ``(value, where it is set)``, the value None where the workflow
    computes it from the run: those rules' ``value(rule, shape)`` at each run's shape, and
    ``describe(rule)``, the formula."""
    runs = list(shapes)
    lines = [
        f"{title}: " + (f"at the runs' shapes ({', '.join(runs)})" if runs else "no run prepared yet"),
        f"  {'rule':<22} {'from':<22} " + " ".join(f"{r:>12}" for r in runs),
    ]
    for rule, (fixed, source) in rules.items():
        if fixed is not None:
            lines.append(f"  {rule:<22} {f'{fixed} ({source})':<22}")
            continue
        values = " ".join(f"{value(rule, shapes[r]):>12}" for r in runs)
        lines.append(f"  {rule:<22} {'the run':<22} {values}   {describe(rule)}")
    return "\n".join(lines)


def _sources(rules, profile, key: str) -> dict:
    """Each rule's ``key`` under ``profile`` and where it is set; None where the workflow computes
    it per job."""
    names = {"set-resources": "profile", "default-resources": "profile default", None: "none"}
    sources = {}
    for rule in rules:
        value, source = (
            ("-", "submit host") if rule.local and profile.cluster else resource(rule, profile, key)
        )
        sources[rule.name] = (None if value == PER_JOB else value or "unset", names.get(source, source))
    return sources
