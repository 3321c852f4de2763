"""What the rule scripts share: running a script under Snakemake or by hand, and the run's config.

Under Snakemake a script finds the job's ``snakemake`` object in its globals. By hand, from the
working directory of a finished run (where ``results/`` is), a script rebuilds the same object from
the workflow for one job (:func:`mock_snakemake`, as PyPSA-Eur's scripts do) and reruns it::

    python scripts/evaluate_checkpoint.py run=digits index=0 epoch=0030 [--configfile my.yaml]

This module imports nothing heavy: the library modules a script uses are imported by the script
itself, so that its rule's code inputs (epochlens.provenance.module_sources) name them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from epochlens.runner import run_step

WORKFLOW = Path(__file__).resolve().parents[1]


def mock_snakemake(
    rule: str, workdir: str | Path = ".", configfiles: Sequence[str | Path] = (), **wildcards: str
):
    """The ``snakemake`` object of one job of ``rule`` (input, output, params, log, config ...),
    built from the workflow as Snakemake builds it, with absolute paths under ``workdir``."""
    from snakemake.api import SnakemakeApi
    from snakemake.dag import DAG
    from snakemake.iocontainers import Snakemake
    from snakemake.jobs import Job
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        DeploymentSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
        WorkflowSettings,
    )

    workdir = Path(workdir).resolve()
    if not configfiles and not (workdir / "config" / "config.yaml").is_file():
        configfiles = [WORKFLOW / "config" / "config.yaml"]  # the embedded default
    here = os.getcwd()
    try:
        with SnakemakeApi(OutputSettings()) as api:
            workflow = api.workflow(
                resource_settings=ResourceSettings(),
                config_settings=ConfigSettings(configfiles=[Path(f).resolve() for f in configfiles]),
                storage_settings=StorageSettings(),
                workflow_settings=WorkflowSettings(),
                deployment_settings=DeploymentSettings(),
                snakefile=WORKFLOW / "Snakefile",
                workdir=workdir,
            )._workflow
            workflow.dag_settings = DAGSettings()
            job = Job(workflow.get_rule(rule), DAG(workflow, rules=[workflow.get_rule(rule)]), wildcards)
            for files in (job.input, job.output, job.log):
                for k, path in enumerate(files):
                    files[k] = str(workdir / path)
            return Snakemake(
                job.input,
                job.output,
                job.params,
                job.wildcards,
                job.threads,
                job.resources,
                job.log,
                workflow.config,
                rule,
                None,
                scriptdir=str(WORKFLOW / "scripts"),
            )
    finally:
        os.chdir(here)


def from_command_line(rule: str, argv: Sequence[str] | None = None):
    """:func:`mock_snakemake` of the job named by ``key=value`` wildcards on the command line."""
    parser = argparse.ArgumentParser(description=f"Rerun one job of rule {rule} on a run's files.")
    parser.add_argument("wildcards", nargs="*", help="the job's wildcards, e.g. run=digits index=0")
    parser.add_argument("--configfile", nargs="*", default=[], help="the run's config file(s)")
    parser.add_argument("--directory", default=".", help="working directory holding results/")
    parser.add_argument("--rule", default=None, help=f"another rule that runs this script (default {rule})")
    args = parser.parse_args(argv)
    wildcards = dict(item.split("=", 1) for item in args.wildcards)
    rule = args.rule or rule
    name = rule.format(**wildcards)  # train_{run}: one training rule per run, wildcard index only
    if "{run}" in rule:
        wildcards.pop("run")
    return mock_snakemake(name, args.directory, args.configfile, **wildcards)


def run_script(main: Callable, rule: str, snakemake=None) -> None:
    """Run ``main(snakemake)`` with its log; by hand, the job named on the command line."""
    if snakemake is None:
        snakemake = from_command_line(rule)
        # Snakemake runs a job with as many threads as it was given (OMP_NUM_THREADS etc.): the
        # same by hand, so that the rerun gives the same bytes.
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(snakemake.threads)
    run_step(lambda: main(snakemake), snakemake.log[0] if snakemake.log else None)


def execution(snakemake, section: str) -> dict:
    """The run's config section ``section``: its execution settings (batch sizes, processes),
    read from the config rather than params, so that changing them reruns nothing."""
    return snakemake.config["runs"][snakemake.wildcards.run][section]


def job_files(snakemake) -> dict:
    """Keyword arguments of :func:`epochlens.job.load_checkpoint_job` from a per-checkpoint job:
    its data set, checkpoint, class order (where the rule has one), epoch, the config's device (an
    execution setting, never a param) and the job's resources (the device applies to a job given
    a GPU; the others compute on the CPU)."""
    inp = snakemake.input
    return {
        "dataset": inp.dataset,
        "checkpoint": inp.checkpoint,
        "class_order": getattr(inp, "class_order", None),
        "epoch": snakemake.wildcards.epoch,
        "device": snakemake.config["device"],
        "resources": job_resources(snakemake),
    }


def job_resources(snakemake) -> dict:
    """The job's resources as a dict (``gpu``, ``gres``, ``mem_mb``, ...)."""
    return {key: value for key, value in snakemake.resources.items() if not key.startswith("_")}
