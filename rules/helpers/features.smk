# Helpers of rules/features.smk: input functions, params and targets.


@cache
def get_feature_epochs(run):
    """Epochs of ``run`` whose features are extracted (and probed)."""
    return run_config.section_epochs(run, config["runs"][run], "features")


def get_feature_params(wildcards):
    return run_config.feature_params(get_run(wildcards))


def feature_targets():
    """Every features file of every run."""
    return [
        path
        for run in config["runs"]
        for path in per_checkpoint(run, layout.features, get_feature_epochs(run))
    ]
