"""What each rule's jobs ask for under a profile (``epochlens doctor --profile``): memory and
time, where each is set, and what the rules sized from the run ask for at the runs prepared in
the folder (epochlens.memory, epochlens.job_time). Torch-free."""

from __future__ import annotations

from epochlens import job_time, memory
from epochlens.rule_devices import PER_JOB, resource


def memory_plan(rules, profile, config) -> str:
    """Where each rule's mem_mb comes from under ``profile``, and what the rules that size it
    from the run ask for at the runs prepared in this folder (epochlens.memory)."""
    return memory.format_memory(_sources(rules, profile, "mem_mb"), memory.run_shapes(config))


def time_plan(rules, profile, config) -> str:
    """The same for runtime (epochlens.job_time)."""
    return job_time.format_times(_sources(rules, profile, "runtime"), memory.run_shapes(config))


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
