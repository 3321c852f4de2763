# Helpers of rules/features.smk: input functions, params and targets.

import re

from epochlens.config.checks import is_text_run
from epochlens.features.text_settings import text_feature_params


@cache
def get_feature_epochs(run):
    """Epochs of ``run`` whose features are extracted (and probed)."""
    return run_config.section_epochs(run, config["runs"][run], "features")


def get_feature_params(wildcards):
    """The cache key's spec; a text run's representations are mean and last (of each block)."""
    run = get_run(wildcards)
    if is_text_run(run):
        return text_feature_params(run)
    return run_config.feature_params(run)


def feature_targets():
    """Every features file of every run."""
    return [
        path
        for run in config["runs"]
        for path in per_checkpoint(run, layout.features, get_feature_epochs(run))
    ]


def runs_pattern(stored):
    """The names of the runs whose features come from stored activations (``stored``) or from a
    model, as a wildcard constraint (one that matches nothing when there are none)."""
    names = [
        re.escape(run)
        for run in config["runs"]
        if run_config.is_stored_run(config["runs"][run]) == stored
    ]
    return "|".join(names) or "(?!x)x"


def get_snapshot(wildcards):
    """The snapshot folder of stored activations of (run, epoch)."""
    return run_config.checkpoint_path(
        wildcards.run, get_run(wildcards), wildcards.index, wildcards.epoch
    )


def get_stored_feature_params(wildcards):
    return run_config.stored_feature_params(get_run(wildcards))


def get_stored_code(wildcards):
    return run_config.stored_code(get_run(wildcards))
