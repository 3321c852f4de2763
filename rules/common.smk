# Setup shared by the rules: the library on the path, config validation, one generic config
# getter, the code inputs of a rule and the results layout. The analysis code and the config
# logic live in src/epochlens (unit-tested without Snakemake); each stage's get_* helpers are in
# its own .smk file. Planning the DAG imports no torch.

import os
import sys
from functools import cache
from pathlib import Path

# Its own folder (workflow.basedir is a project's when it is a module), its library first on the
# path here and in the jobs (PYTHONPATH; a conda job gets this sys.path from Snakemake instead).
WORKFLOW_DIR = Path(str(workflow.current_basedir)).parent
_SRC = str(WORKFLOW_DIR / "src")
sys.path.insert(0, _SRC)
os.environ.update(
    PYTHONPATH=os.pathsep.join(filter(None, [_SRC, os.getenv("PYTHONPATH")]))
)

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from epochlens import config as run_config
from epochlens.errors import EpochlensError
from epochlens.formats.factory import FactorySpec, factory_sources
from epochlens.layout import RESULTS as layout
from epochlens.provenance import PACKAGE_DIR, module_sources
from epochlens.job_time import job_runtime
from epochlens.memory import job_mem_mb, shard_share
from epochlens.resources import gpu_request

SCHEMA, SCRIPTS = WORKFLOW_DIR / "config" / "schema.yaml", WORKFLOW_DIR / "scripts"
LAYOUT_SOURCE = PACKAGE_DIR / "layout.py"


def validate_config(cfg):
    """Schema check (fills defaults), then the checks a schema cannot express; errors name the
    keys to fix (epochlens.config)."""
    try:
        run_config.validate(cfg, SCHEMA)
    except EpochlensError as exc:
        raise WorkflowError(str(exc)) from None


def config_provider(*keys, default=None):
    """A function of the wildcards that reads ``config["runs"][run][keys[0]][keys[1]]...`` (or
    ``default`` where a key is missing): the params and inputs that come from a run's config.
    """

    def getter(wildcards):
        node = config["runs"][wildcards.run]
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    getter.__name__ = "config_" + "_".join(keys)
    return getter


def get_run(wildcards):
    return config["runs"][wildcards.run]


def get_code(script):
    """A rule's script plus every library module (and helper) it imports: editing any of them
    reruns the rule, and only the rules that import it (but layout.py: code_input)."""
    path = SCRIPTS / script
    return [str(path)] + [code_input(p) for p in module_sources(path)]


def code_input(path):
    """A library module as a rule's input; epochlens/layout.py as ancient (its edits rerun
    nothing): it spells where files are, and a path it changes shows to Snakemake as outputs that
    do not exist, which reruns what they need by itself. As a plain input it made each path added
    to it rerun the training of every run (scripts/train.py asks it for the resume folder), then
    everything after. Ancient, not left out: a job's set of inputs stays what earlier runs
    recorded (a changed set reruns it too)."""
    return ancient(str(path)) if path == LAYOUT_SOURCE else str(path)


@cache
def get_epochs(run):
    """Checkpoint epochs analysed for ``run``."""
    return run_config.analysis_epochs(run, config["runs"][run])


def get_checkpoint(wildcards):
    """The checkpoint of (run, index, epoch): trained by the pipeline or in the user's folder
    (epochlens.config.checkpoint_path). Every checkpoint input goes through here; a missing one
    of the user's folder: see on_missing_checkpoint."""
    run = get_run(wildcards)
    path = run_config.checkpoint_path(
        wildcards.run, run, wildcards.index, wildcards.epoch, layout
    )
    if run_config.needs_file(run) and not os.path.exists(path):
        return on_missing_checkpoint(wildcards)
    return path


def get_task_name(wildcards):
    """The run's task by name (classification, regression, language_model or an import path)."""
    return run_config.task_name(get_run(wildcards))


def get_hf_task(wildcards):
    """A text run's model.hf.task (text_to_text tokenises targets as decoder labels), else None."""
    return get_run(wildcards)["model"].get("hf", {}).get("task")


def get_class_schedule(wildcards):
    """The run's class schedule, None for a causal LM (epochlens.config.class_schedule)."""
    return run_config.class_schedule(get_run(wildcards))


def get_model_param(wildcards):
    """The run's model: a built-in name, or your model's section (epochlens.config.model_param)."""
    return run_config.model_param(get_run(wildcards))


def get_model_code(wildcards):
    """Your model's source files (the project files model.factory imports): inputs of every job
    that builds the model, so that editing them reruns those jobs only. Where your command trains
    the run, they are its training's inputs (get_command_files) and ancient here: an edit reaches
    every stage through the checkpoints it retrains, and none before (docs/reliability.md).
    """
    run = get_run(wildcards)
    files = model_sources(run)
    if run["checkpoints"]["source"] == "command":
        return [ancient(f) for f in files]
    return files


def model_sources(run):
    """The run's model.factory source files ([] for a built-in or Hugging Face model)."""
    if "factory" not in run["model"]:
        return []
    return [str(p) for p in factory_sources(FactorySpec.from_config(run["model"]))]


_warned_missing = []


def on_missing_checkpoint(wildcards):
    """A job needs a checkpoint that is not on disk. Every missing checkpoint of the config is
    listed in one message (not one per dry run). Without --keep-going that message is the error:
    nothing runs. With it, the message is a warning (once) and the job's checkpoint input is the
    output of a missing_checkpoint job, which fails with the fix: the epochs that have their
    checkpoints run, the missing ones fail alone."""
    settings = getattr(workflow, "execution_settings", None)
    keep_going = bool(settings is not None and settings.keep_going)
    missing = run_config.missing_checkpoints(config)
    message = run_config.missing_checkpoints_message(missing, config, keep_going)
    if not keep_going:
        raise WorkflowError(message)
    if not _warned_missing:
        logger.warning(message)
        _warned_missing.append(True)
    return layout.missing_checkpoint(wildcards.run, wildcards.index, wildcards.epoch)


def get_missing_checkpoint_error(wildcards):
    """The error of one missing_checkpoint job: the file, the run's template and the fix."""
    missing = run_config.MissingCheckpoint(
        wildcards.run,
        int(wildcards.index),
        int(wildcards.epoch),
        run_config.checkpoint_path(
            wildcards.run, get_run(wildcards), wildcards.index, wildcards.epoch
        ),
    )
    return run_config.missing_checkpoint_error(missing, config)


def get_mem_mb(wildcards, input, attempt, rulename):
    """A job's memory (MB) from its run's shapes: the data set's samples (a shard job's share),
    the model's bytes, x the attempt (epochlens.memory); evaluated again once the job's inputs
    exist."""
    run = config["runs"].get(getattr(wildcards, "run", None), {})
    share, method = shard_share(wildcards), getattr(wildcards, "method", None)
    return job_mem_mb(rulename, input, attempt, share=share, run=run, method=method)


def get_runtime(wildcards, input, attempt, rulename):
    """A model job's wall time (minutes) from its run's shapes: samples, checkpoints, the model's
    bytes, its shard's share, x the attempt (epochlens.job_time)."""
    return job_runtime(rulename, input, wildcards, attempt)


def get_gpu_resources():
    """Resources of the rules that compute on a GPU when there is one. One GPU (none with
    device: cpu). Its jobs use the config's device; every other job computes on the CPU
    (epochlens.resources). Memory and time from the run (get_mem_mb, get_runtime); a profile
    sets CPUs.
    """
    return {
        "gpu": gpu_request(config["device"]),
        "mem_mb": get_mem_mb,
        "runtime": get_runtime,
    }


def per_index(run, path, **kwargs):
    """``path(run, index, **kwargs)`` for every replicate index of ``run``."""
    return [path(run, index, **kwargs) for index in config["runs"][run]["indices"]]


def per_checkpoint(run, path, epochs):
    """``path(run, index, epoch)`` for every index of ``run`` and each of ``epochs`` (index-major)."""
    return [
        path(run, index, epoch)
        for index in config["runs"][run]["indices"]
        for epoch in epochs
    ]


def all_targets():
    """The default target (all): every stage's per-checkpoint results, tables and figures."""
    targets = (
        figure_targets()
        + curvature_targets()
        + feature_targets()
        + probe_targets()
        + ablation_targets()
        + influence_targets()
        + sample_targets()
        + explorer_targets()
        + comparison_targets()
    )
    return list(dict.fromkeys(targets))
