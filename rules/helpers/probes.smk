# Helpers of rules/probes.smk: input functions, params and targets.


@cache
def get_probe_epochs(run):
    return run_config.probe_epochs(run, config["runs"][run])


def get_probe_params(wildcards):
    return run_config.probe_params(get_run(wildcards))


def get_probe_curvature(wildcards):
    """per_image_curvature.npy of (run, index, epoch) where the curvature target is asked for and
    curvature is computed at that epoch; none otherwise (the probes skip the target and say so).
    """
    if "curvature" not in get_probe_params(wildcards)["targets"]:
        return []
    if int(wildcards.epoch) not in get_curvature_epochs(wildcards.run):
        return []
    return [
        layout.curvature_array(
            "curvature", wildcards.run, wildcards.index, wildcards.epoch
        )
    ]


def probe_tables_of(run):
    """The per-epoch probe tables of ``run`` that probe_tables gathers: one per checkpoint, or one
    per (snapshot, representation) of a run of stored activations."""
    epochs = get_probe_epochs(run)
    if is_stored(run):
        return per_representation(run, layout.stored_probe_table, epochs)
    return per_checkpoint(run, layout.probe_table, epochs)


def get_run_probe_tables(wildcards):
    return probe_tables_of(wildcards.run)


def probe_figures():
    return [
        path
        for run in config["runs"]
        if get_probe_epochs(run)
        for path in layout.figures("probe_accuracy", run)
    ]


def probe_targets():
    """Every probe result: per-epoch tables, the run's table and its figure."""
    return [
        path
        for run in config["runs"]
        if get_probe_epochs(run)
        for path in probe_tables_of(run)
        + [layout.table("probes", run)]
        + layout.figures("probe_accuracy", run)
    ]
