# Helpers of rules/ablation.smk: input functions, params and targets.


@cache
def get_ablation_epochs(run):
    return run_config.section_epochs(run, config["runs"][run], "ablation")


def get_ablation_params(wildcards):
    return run_config.ablation_params(get_run(wildcards))


def get_run_ablation_tables(wildcards):
    run = wildcards.run
    return per_checkpoint(run, layout.ablation_table, get_ablation_epochs(run))


def ablation_figures():
    return [
        path
        for run in config["runs"]
        if get_ablation_epochs(run)
        for path in layout.figures("ablation_effect", run)
    ]


def ablation_targets():
    """Every ablation result: per-epoch tables, the run's table and its figure."""
    return [
        path
        for run in config["runs"]
        if get_ablation_epochs(run)
        for path in per_checkpoint(run, layout.ablation_table, get_ablation_epochs(run))
        + [layout.table("ablation", run)]
        + layout.figures("ablation_effect", run)
    ]
