# Helpers of rules/curvature.smk: input functions, params and targets.

from epochlens.curvature.io import ARRAY_DTYPES
from epochlens.layout import shard_name


@cache
def get_curvature_epochs(run):
    """Epochs of ``run`` whose curvature is computed (none when curvature is disabled)."""
    return run_config.curvature_epochs(run, config["runs"][run])


def curvature_runs():
    """Runs whose curvature is computed at one epoch or more."""
    return [run for run in config["runs"] if get_curvature_epochs(run)]


def get_curvature_shards(wildcards):
    """The shard files that curvature_epoch merges for (run, index, epoch)."""
    nshards = get_run(wildcards)["curvature"]["shards"]
    return [
        layout.curvature_shard(
            wildcards.run, wildcards.index, wildcards.epoch, k, nshards
        )
        for k in range(nshards)
    ]


def get_curvature_params(wildcards):
    return run_config.curvature_params(get_run(wildcards))


def get_curvature_settings(wildcards):
    return get_curvature_params(wildcards)["settings"]


def get_curvature_threads(wildcards):
    """CPU threads of a shard job: at least one per process."""
    return max(1, get_run(wildcards)["curvature"]["processes"])


def get_run_curvature_metadata(wildcards):
    """metadata.json of each (index, epoch), index-major (curvature_tables reads them so)."""
    run = wildcards.run
    return per_checkpoint(run, layout.curvature_metadata, get_curvature_epochs(run))


def get_run_curvature_arrays(wildcards):
    """Every per_image_*.npy file of the run, so that a rebuilt epoch reruns the tables."""
    run = wildcards.run
    return [
        layout.curvature_array(key, run, index, epoch)
        for index in config["runs"][run]["indices"]
        for epoch in get_curvature_epochs(run)
        for key in ARRAY_DTYPES
    ]


def get_class_orders(wildcards):
    return per_index(wildcards.run, layout.class_order)


def get_run_curvature_epochs(wildcards):
    return get_curvature_epochs(wildcards.run)


def curvature_figures():
    return [
        path
        for run in curvature_runs()
        for name in ("by_cohort", "distribution", "vs_loss")
        for path in layout.figures(f"curvature_{name}", run)
    ]


def curvature_targets():
    """Every curvature result: per-epoch files, tables and figures of every run."""
    per_epoch = [
        path
        for run in curvature_runs()
        for path in per_checkpoint(
            run, layout.curvature_metadata, get_curvature_epochs(run)
        )
    ]
    return per_epoch + curvature_figures()
