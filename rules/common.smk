# Setup shared by the rules: the library on the path, config validation, one generic config
# getter, the code inputs of a rule and the results layout. The analysis code and the config
# logic live in src/epochlens (unit-tested without Snakemake); each stage's get_* helpers are in
# its own .smk file. Planning the DAG imports no torch.

import os
import sys
from functools import cache
from pathlib import Path

# Prefer the library next to this Snakefile over any other installed copy, here and in the jobs'
# scripts (which inherit the environment).
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
os.environ.update(
    PYTHONPATH=os.pathsep.join(filter(None, [_SRC, os.getenv("PYTHONPATH")]))
)

from snakemake.exceptions import WorkflowError

from epochlens import config as run_config
from epochlens.errors import EpochlensError
from epochlens.layout import RESULTS as layout
from epochlens.provenance import module_sources

SCHEMA = Path(workflow.basedir) / "config" / "schema.yaml"
SCRIPTS = Path(workflow.basedir) / "scripts"


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
    reruns the rule, and only the rules that import it."""
    path = SCRIPTS / script
    return [str(path)] + [str(p) for p in module_sources(path)]


@cache
def get_epochs(run):
    """Checkpoint epochs analysed for ``run``."""
    return run_config.analysis_epochs(run, config["runs"][run])


def get_checkpoint(wildcards):
    """The checkpoint of (run, index, epoch): trained by the pipeline or in the user's folder."""
    ckpt = get_run(wildcards)["checkpoints"]
    if ckpt["source"] == "train":
        return layout.checkpoint(wildcards.run, wildcards.index, wildcards.epoch)
    path = Path(
        ckpt["path"].format(index=int(wildcards.index), epoch=int(wildcards.epoch))
    )
    if not path.is_file():
        raise WorkflowError(
            f"{path}: checkpoint not found (run {wildcards.run}, index {wildcards.index}, epoch "
            f"{int(wildcards.epoch)}). Copy it from the training run, fix checkpoints.path, or "
            "restrict runs.<run>.epochs to the epochs you have."
        )
    return str(path)


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
    )
    return list(dict.fromkeys(targets))
