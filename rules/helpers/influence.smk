# Helpers of rules/influence.smk: input functions, params and targets.

from types import SimpleNamespace

from epochlens.config.results import STORE_METHODS
from epochlens.influence.projection_settings import PROJECTED_METHODS
from epochlens.influence.settings import FACTOR_METHODS

#: Wildcard constraints: the methods scored from a gradient store, those with its curvature.
STORE = "|".join(STORE_METHODS)
PROJECTED = "|".join(PROJECTED_METHODS)
INFLUENCE_FIGURES = ("poison_roc", "top_influential_images", "influence_conditioning")


@cache
def get_influence_epochs(run):
    return run_config.influence_epochs(run, config["runs"][run])


@cache
def get_influence_indices(run):
    """Replicate indices whose influence is computed (influence.indices, or every index)."""
    return run_config.influence_indices(run, config["runs"][run])


def influence_runs():
    """Runs whose influence is computed at one epoch or more."""
    return [run for run in config["runs"] if get_influence_epochs(run)]


def get_influence_factor_params(wildcards):
    return run_config.influence_factor_params(get_run(wildcards), wildcards.method)


def get_influence_curvature_params(wildcards):
    return run_config.influence_curvature_params(get_run(wildcards), wildcards.method)


def get_influence_score_params(wildcards):
    return run_config.influence_score_params(
        wildcards.run, get_run(wildcards), wildcards.method, int(wildcards.epoch)
    )


def get_influence_tracin_checkpoints(wildcards):
    """Checkpoints of the TracIn sum (none for the other methods)."""
    return [
        get_checkpoint(
            SimpleNamespace(run=wildcards.run, index=wildcards.index, epoch=f"{e:04d}")
        )
        for e in get_influence_score_params(wildcards)["tracin_epochs"]
    ]


def shard_log(kind):
    """Log and benchmark name of a shard job: ``{method}/{kind}_{shard}-of-{nshards}``."""
    return f"{{method}}/{kind}_{{shard}}-of-{{nshards}}"


def get_influence_shards(wildcards):
    """influence.shards of the run: jobs per pass over the training images."""
    return get_run(wildcards)["influence"]["shards"]


def influence_shard_files(wildcards, kind, ext=None, epoch=None):
    w, n = wildcards, get_influence_shards(wildcards)
    return [
        layout.influence_shard(
            kind, w.run, w.index, epoch or w.epoch, w.method, k, n, ext
        )
        for k in range(n)
    ]


def get_influence_covariance_shards(wildcards):
    """The covariance shards that the eigenbasis (ekfac) or the factors (kfac) sum up."""
    return influence_shard_files(wildcards, "covariances")


def get_influence_factor_covariances(wildcards):
    """Covariance shards of K-FAC's factors, when sharded (EK-FAC's go through its eigenbasis)."""
    if wildcards.method != "kfac" or get_influence_shards(wildcards) == 1:
        return []
    return get_influence_covariance_shards(wildcards)


def get_influence_eigenbasis(wildcards):
    """EK-FAC's eigenbasis, when its fit is sharded (its correction shards rotate into it)."""
    if wildcards.method != "ekfac" or get_influence_shards(wildcards) == 1:
        return []
    w = wildcards
    return [layout.influence_file("eigenbasis.pt", w.run, w.index, w.epoch, w.method)]


def get_influence_correction_shards(wildcards):
    """Correction (ekfac) or diagonal shards of the factors, when sharded."""
    if wildcards.method == "kfac" or get_influence_shards(wildcards) == 1:
        return []
    return influence_shard_files(wildcards, "corrections")


def get_influence_score_shards(wildcards):
    """The score shards that influence_scores concatenates (none when not sharded)."""
    if get_influence_shards(wildcards) == 1:
        return []
    return influence_shard_files(wildcards, "scores")


def store_epochs(wildcards):
    """The checkpoints whose stores a job reads: tracin_rp's tracin_epochs, else its own."""
    if wildcards.method != "tracin_rp":
        return [wildcards.epoch]
    return [f"{e:04d}" for e in get_influence_score_params(wildcards)["tracin_epochs"]]


def store_shard_files(wildcards, ext=None):
    """The store's shards (influence.shards), in order; tracin_rp: those of each of its
    checkpoints, checkpoint by checkpoint."""
    return [
        path
        for epoch in store_epochs(wildcards)
        for path in influence_shard_files(wildcards, "store", ext, epoch)
    ]


def get_influence_store_gradients(wildcards):
    """The gradient store's rows, one .npy a shard (store_shard_files)."""
    return store_shard_files(wildcards, "npy")


def get_influence_store_infos(wildcards):
    """What each of the store's shards holds (positions, losses, Gauss-Newton sums, key)."""
    return store_shard_files(wildcards)


def get_influence_store_curvature(wildcards):
    """The store's curvature (logra, trak); none for tracin_rp, which has no curvature."""
    if wildcards.method not in PROJECTED_METHODS:
        return []
    w = wildcards
    return layout.influence_file("curvature.pt", w.run, w.index, w.epoch, w.method)


def get_influence_factors(wildcards):
    """factors.pt of (run, index, epoch, method); none for identity and tracin."""
    if wildcards.method not in FACTOR_METHODS:
        return []
    w = wildcards
    return [layout.influence_file("factors.pt", w.run, w.index, w.epoch, w.method)]


def influence_jobs(run):
    """(index, epoch, method) of every influence_scores job of ``run``, index-major."""
    spec = config["runs"][run]["influence"]
    return [
        {"index": index, "epoch": epoch, "method": method}
        for index in get_influence_indices(run)
        for epoch in get_influence_epochs(run)
        for method in spec["methods"]
    ]


def get_run_influence_jobs(wildcards):
    return influence_jobs(wildcards.run)


def influence_files(run, name):
    return [layout.influence_file(name, run, **job) for job in influence_jobs(run)]


def get_run_influence_scores(wildcards):
    return influence_files(wildcards.run, "scores.npz")


def get_run_influence_diagnostics(wildcards):
    return influence_files(wildcards.run, "diagnostics.csv")


def get_poison_detection_params(wildcards):
    return run_config.poison_detection_params(get_run(wildcards))


def get_corruption(wildcards):
    return run_config.corruption(get_run(wildcards))


def influence_figures():
    return [
        path
        for run in influence_runs()
        for name in INFLUENCE_FIGURES
        for path in layout.figures(name, run)
    ]


def lds_runs():
    """Runs whose influence is checked by the linear datamodeling score (influence.lds)."""
    return [
        run
        for run in influence_runs()
        if config["runs"][run]["influence"]["lds"]["enabled"]
    ]


def get_lds_retrain_run(wildcards):
    """The run's training recipe, data, model and schedule (what its training job reads)."""
    return run_config.lds_retrain_params(get_run(wildcards))["run"]


def get_lds_retrain_settings(wildcards):
    """influence.lds's settings that change the retrainings (subsets, fraction, seed)."""
    return run_config.lds_retrain_params(get_run(wildcards))["lds"]


def get_lds_start_epoch(wildcards):
    """The run's checkpoint epoch the retrainings start from (None: from scratch)."""
    return run_config.lds_start_epoch(get_run(wildcards), int(wildcards.epoch))


def get_lds_start_checkpoint(wildcards):
    """The run's checkpoint the retrainings start from ([] from scratch)."""
    start = get_lds_start_epoch(wildcards)
    if start is None:
        return []
    return [
        get_checkpoint(
            SimpleNamespace(
                run=wildcards.run, index=wildcards.index, epoch=f"{start:04d}"
            )
        )
    ]


def get_lds_command_data(wildcards):
    """The {data} export that a run's training command retrains on ([] for a run the pipeline
    trains)."""
    if get_run(wildcards)["checkpoints"]["source"] != "command":
        return []
    return [layout.training_data(wildcards.run)]


def get_lds_command_files(wildcards):
    """The files a run's training command depends on, pinned to the commit as for its training
    jobs (get_command_files): editing them retrains the subsets too ([] for a run the pipeline
    trains)."""
    if get_run(wildcards)["checkpoints"]["source"] != "command":
        return []
    return get_command_files(wildcards.run)(wildcards)


def get_lds_table_params(wildcards):
    return run_config.lds_table_params(get_run(wildcards))


def lds_checkpoints(run):
    """(index, epoch) of every checkpoint whose LDS is measured, index-major."""
    return [
        (index, epoch)
        for index in get_influence_indices(run)
        for epoch in get_influence_epochs(run)
    ]


def get_lds_checkpoints(wildcards):
    return lds_checkpoints(wildcards.run)


def get_lds_parts(wildcards):
    """Every retraining part of the run, checkpoint-major (as lds_checkpoints)."""
    n = get_run(wildcards)["influence"]["lds"]["parts"]
    return [
        layout.lds_part(wildcards.run, index, epoch, part, n)
        for index, epoch in lds_checkpoints(wildcards.run)
        for part in range(n)
    ]


def influence_targets():
    """Every influence result: per-epoch scores, the study's tables and figures of every run."""
    return (
        [
            path
            for run in influence_runs()
            for path in influence_files(run, "metadata.json")
            + [layout.table("poison_detection", run)]
        ]
        + influence_figures()
        + [path for run in lds_runs() for path in layout.figures("lds", run)]
    )
