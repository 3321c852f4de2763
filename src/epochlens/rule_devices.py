"""Which device each rule's jobs use under a Snakemake profile (``epochlens doctor --profile``).

A job computes on the config's ``device`` when its resources give it a GPU, on the CPU otherwise
(:mod:`epochlens.resources`). A job's resources are the rule's own (the workflow gives a GPU to
the rules that compute on one), then a profile's ``set-resources`` for that rule, then its
``default-resources`` for what is still unset: :func:`plan_devices` applies the same order to
the rules of the workflow (:func:`workflow_rules`) and a profile's settings as Snakemake reads
them (:func:`profile_settings`, both through Snakemake's own parsers), and :func:`plan_checks`
says what cannot work before any job is submitted (e.g. ``device: cuda:1`` where a job is given
one GPU, which it sees as ``cuda:0``).

The planning itself (:func:`plan_devices`, :func:`plan_checks`, :func:`format_plan`) is plain
Python on dicts; only the two loaders import Snakemake. Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochlens.provenance import PACKAGE_DIR, module_sources
from epochlens.resources import GPU_RESOURCES, gpus_requested, job_device

#: A resource whose value depends on the job (a function of its wildcards, attempt, ...).
PER_JOB = "<per job>"
LOCAL_EXECUTORS = (None, "", "local", "dryrun", "touch")


@dataclass(frozen=True)
class RuleSpec:
    """What the workflow says about a rule: its name, whether it is a local rule, the resources
    it declares (values, or :data:`PER_JOB`), whether its script computes on a torch device, and
    the script."""

    name: str
    local: bool = False
    resources: Mapping[str, Any] = field(default_factory=dict)
    uses_device: bool = False
    script: Path | None = None


@dataclass(frozen=True)
class ProfileSettings:
    """What a profile sets that decides devices: the executor and the resources."""

    name: str
    executor: str | None = None
    set_resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    default_resources: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cluster(self) -> bool:
        """Jobs run elsewhere (a cluster's nodes), not on the machine that runs Snakemake."""
        return self.executor not in LOCAL_EXECUTORS


@dataclass(frozen=True)
class RuleDevice:
    """Where a rule's jobs run, the GPUs they are given (None: it depends on the job), the device
    they compute on (None: the rule's script uses no torch device) and where the GPU request
    comes from (``workflow``, ``set-resources``, ``default-resources`` or ``none``)."""

    rule: str
    runs_on: str
    gpus: int | None
    device: str | None
    source: str


def resource(rule: RuleSpec, profile: ProfileSettings, key: str) -> tuple[Any, str | None]:
    """A resource of a rule's jobs under ``profile`` and where it is set: ``set-resources`` for the
    rule, else the rule's own, else ``default-resources``; ``(None, None)`` when none sets it."""
    for source, values in (
        ("set-resources", profile.set_resources.get(rule.name, {})),
        ("workflow", rule.resources),
        ("default-resources", profile.default_resources),
    ):
        if values.get(key) not in (None, ""):
            return values[key], source
    return None, None


def gpu_resources(rule: RuleSpec, profile: ProfileSettings) -> tuple[dict[str, Any], str]:
    """The GPU resources (``gpu``, ``gpu_model``, ``gres``) a rule's jobs get under ``profile``
    (:func:`resource`), and where the deciding ones come from."""
    found = [(key, *resource(rule, profile, key)) for key in GPU_RESOURCES]
    chosen = {key: value for key, value, source in found if source}
    return chosen, next((source for _, _, source in found if source), "none")


def plan_devices(rules: Iterable[RuleSpec], profile: ProfileSettings, device: str) -> list[RuleDevice]:
    """Each rule's :class:`RuleDevice` under ``profile`` with the config's ``device``."""
    plan = []
    for rule in rules:
        resources, source = gpu_resources(rule, profile)
        gpus = None if PER_JOB in resources.values() else gpus_requested(resources)
        runs_on = ("submit host" if rule.local else "cluster job") if profile.cluster else "this machine"
        if not rule.uses_device:  # no device resolved (job_device raises for one the job lacks)
            used = None
        else:
            used = f"{device} if given a GPU, else cpu" if gpus is None else job_device(device, resources)
        plan.append(RuleDevice(rule.name, runs_on, gpus, used, source))
    return plan


def plan_checks(
    plan: Sequence[RuleDevice], profile: ProfileSettings, device: str
) -> list[tuple[str, str, str]]:
    """``(name, status, detail)`` of what the plan means for ``device``: ``fail`` where a job
    cannot have its device, ``warn`` where GPUs would be wasted or unused, ``ok`` otherwise."""
    checks = []
    gpu_rules = [r for r in plan if r.device is not None and r.gpus]
    cpu_rules = [r for r in plan if r.device is not None and r.gpus == 0]
    index = re.fullmatch(r"cuda:(\d+)", device)
    if index and profile.cluster:
        n = int(index.group(1))
        short = [r for r in gpu_rules if r.gpus <= n]
        for r in short:
            seen = "cuda:0" if r.gpus == 1 else f"cuda:0 to cuda:{r.gpus - 1}"
            checks.append(
                (
                    "devices",
                    "fail",
                    f"device: {device}, but each {r.rule} job is given {r.gpus} GPU(s), which it "
                    f"sees as {seen}: use device: cuda, or give it {n + 1} "
                    f"(set-resources: {r.rule}: {{gpu: {n + 1}}})",
                )
            )
    if device == "cpu" and gpu_rules:
        names = ", ".join(r.rule for r in gpu_rules)
        checks.append(
            ("devices", "warn", f"device: cpu, but {names} are given GPUs they will not use: set gpu: 0")
        )
    if device != "cpu" and not gpu_rules:
        checks.append(
            (
                "devices",
                "warn",
                f"device: {device}, but no rule is given a GPU under profile {profile.name}: "
                "every job computes on the CPU",
            )
        )
    elif gpu_rules and not checks:
        names = ", ".join(r.rule for r in gpu_rules)
        detail = f"{device} in the jobs given a GPU ({names})"
        if cpu_rules:
            detail += f"; cpu in {', '.join(r.rule for r in cpu_rules)}"
        checks.append(("devices", "ok", detail))
    return checks


def format_plan(plan: Sequence[RuleDevice], profile: ProfileSettings, device: str) -> str:
    """The plan as a table, one line per rule."""
    executor = profile.executor or "local"
    lines = [
        f"Devices under profile {profile.name} (executor: {executor}), config device: {device}",
        f"  {'rule':<22} {'runs on':<13} {'GPUs':<5} {'device':<16} GPU request from",
    ]
    for r in plan:
        gpus = "?" if r.gpus is None else str(r.gpus)
        used = r.device if r.device is not None else "- (no torch)"
        lines.append(f"  {r.rule:<22} {r.runs_on:<13} {gpus:<5} {used:<16} {r.source}")
    return "\n".join(lines)


# -- what Snakemake reads ----------------------------------------------------------------------


def _raw(value: Any) -> Any:
    """A Snakemake resource (or plain value) as a value, or :data:`PER_JOB` for a function."""
    if callable(value):
        return PER_JOB
    is_evaluable = getattr(value, "is_evaluable", None)
    if is_evaluable is not None:
        if not is_evaluable():
            return value.value
        try:
            context = {"wildcards": {}, "input": [], "output": [], "rulename": "", "async_run": None}
            return value.evaluate(attempt=1, threads=1, **context).value
        except Exception:  # noqa: BLE001 - any function of the job's context
            return PER_JOB
    return value


def _raw_resources(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: _raw(value) for key, value in (resources or {}).items() if not key.startswith("_")}


def profile_settings(profile: str, snakefile: str | Path) -> ProfileSettings:
    """The executor, ``set-resources`` and ``default-resources`` of ``profile`` (a folder, or a
    profile name that Snakemake looks up in ~/.config/snakemake/), together with the workflow's
    own profile (profiles/default), as ``snakemake --profile`` reads them."""
    from snakemake import cli

    _, args = cli.parse_args(["--profile", str(profile), "--snakefile", str(snakefile), "--dry-run"])
    set_resources = {rule: _raw_resources(values) for rule, values in (args.set_resources or {}).items()}
    return ProfileSettings(
        name=str(profile),
        executor=args.executor,
        set_resources=set_resources,
        default_resources=_raw_resources(args.default_resources),
    )


def workflow_rules(
    snakefile: str | Path, configfiles: Sequence[str | Path] = (), workdir: str | Path | None = None
) -> tuple[list[RuleSpec], dict]:
    """The workflow's rules that run a script (targets such as ``all`` left out) and the config
    they were built from: ``configfiles``, or the workflow's embedded default; the config's paths
    relative to ``workdir`` (default: the Snakefile's folder)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DeploymentSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
        WorkflowSettings,
    )

    snakefile = Path(snakefile).resolve()
    files = [Path(f).resolve() for f in configfiles] or [snakefile.parent / "config" / "config.yaml"]
    device_module = (PACKAGE_DIR / "device.py").resolve()
    # Snakemake changes to the working directory, the Snakefile edits sys.path and PYTHONPATH
    here, environ, path = os.getcwd(), dict(os.environ), list(sys.path)
    try:
        with SnakemakeApi(OutputSettings()) as api:
            workflow = api.workflow(
                resource_settings=ResourceSettings(),
                config_settings=ConfigSettings(configfiles=files),
                storage_settings=StorageSettings(),
                workflow_settings=WorkflowSettings(),
                deployment_settings=DeploymentSettings(),
                snakefile=snakefile,
                workdir=Path(workdir).resolve() if workdir else snakefile.parent,
            )._workflow
            rules = []
            for rule in workflow.rules:
                if not rule.script:
                    continue
                script = (Path(rule.snakefile).parent / str(rule.script)).resolve()
                rules.append(
                    RuleSpec(
                        rule.name,
                        local=rule.name in workflow._localrules,
                        resources=_raw_resources(rule.resources),
                        uses_device=device_module in module_sources(script),
                        script=script,
                    )
                )
            return rules, dict(workflow.config)
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
