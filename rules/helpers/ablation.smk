# Helpers of rules/ablation.smk: input functions, params and targets.


@cache
def get_ablation_epochs(run):
    return run_config.section_epochs(run, config["runs"][run], "ablation")


def ablation_part_table(part="{part}", nparts="{nparts}", **wildcards):
    """Part ``part`` of ``nparts`` of a checkpoint's ablation table (ablation.parts)."""
    table = layout.ablation_table(**wildcards)
    return f"{table.removesuffix('.csv')}/part_{part}-of-{nparts}.csv"


def in_one_part(get):
    """An input (``get`` of the wildcards) of a checkpoint's ablation in one job; none for the
    merge of its parts."""
    return lambda wildcards: (
        [] if get_run(wildcards)["ablation"]["parts"] > 1 else get(wildcards)
    )


def get_ablation_parts(wildcards):
    """The part tables that make a checkpoint's table (none in one part: it computes it)."""
    n = get_run(wildcards)["ablation"]["parts"]
    keys = {"run": wildcards.run, "index": wildcards.index, "epoch": wildcards.epoch}
    return [ablation_part_table(k, n, **keys) for k in range(n)] if n > 1 else []


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
