# Helpers of rules/features.smk: input functions, params and targets.

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
