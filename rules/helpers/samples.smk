# Helpers of rules/samples.smk: input functions, params and targets.

from epochlens.config.run_kinds import is_text_run, is_text_to_text_run
from epochlens.layout import shard_name

#: The tasks whose checkpoints give a dossier its series (a user's own task callable has no
#: probability of a label nor absolute error that epochlens knows how to read).
DOSSIER_TASKS = ("classification", "regression", "language_model", "text_to_text")


def dossier_kind(run):
    """What a run's samples are (the dossier's ``task``), None where it has no dossier: stored
    activations (no model to predict with) and a task of your own (see DOSSIER_TASKS).
    """
    spec = config["runs"][run]
    if (
        run_config.is_stored_run(spec)
        or run_config.task_name(spec) not in DOSSIER_TASKS
    ):
        return None
    if run_config.is_regression_run(spec):
        return "regression"
    if run_config.is_causal_lm_run(spec):
        return "causal_lm"
    if is_text_to_text_run(spec):
        return "text_to_text"
    return "text_classification" if is_text_run(spec) else "classification"


def samples_enabled(run):
    return config["runs"][run]["samples"]["enabled"]


def dossier_runs():
    """Runs that get a dossier (samples.enabled); those that cannot are named once in a message."""
    runs = [run for run in config["runs"] if dossier_kind(run) and samples_enabled(run)]
    skipped = [run for run in config["runs"] if not dossier_kind(run)]
    if skipped and not _warned_dossier:
        logger.info(
            f"no sample dossier for {', '.join(skipped)}: stored activations have no model to predict "
            f"with, and a task of your own none of {', '.join(DOSSIER_TASKS)} (README 'Looking at samples')"
        )
        _warned_dossier.append(True)
    return runs


_warned_dossier = []


def get_dossier_kind(wildcards):
    kind = dossier_kind(wildcards.run)
    if kind is None:
        raise WorkflowError(
            f"runs.{wildcards.run}: no sample dossier for stored activations or a task of your own "
            f"(one of {', '.join(DOSSIER_TASKS)} has one)"
        )
    if not samples_enabled(wildcards.run):
        raise WorkflowError(
            f"runs.{wildcards.run}.samples.enabled is false: set it to true (the default) for the "
            "run's sample dossier, data map and explorer"
        )
    return kind


def get_run_epochs(wildcards):
    return list(get_epochs(wildcards.run))


def get_index_checkpoints(wildcards):
    """The checkpoint of every analysed epoch of (run, index), in epoch order."""
    get_dossier_kind(wildcards)  # a run without a dossier is refused here, naming why
    return [
        get_checkpoint(
            SimpleNamespace(run=wildcards.run, index=wildcards.index, epoch=f"{e:04d}")
        )
        for e in get_epochs(wildcards.run)
    ]


def get_sample_output_shards(wildcards):
    """The shard files that sample_outputs merges for (run, index), in shard order."""
    nshards = get_run(wildcards)["samples"]["shards"]
    return [
        layout.sample_outputs_shard(wildcards.run, wildcards.index, k, nshards)
        for k in range(nshards)
    ]


def get_sample_outputs(wildcards):
    get_dossier_kind(wildcards)
    return per_index(wildcards.run, layout.sample_outputs)


def dossier_curvature_jobs(run):
    """(index, epoch) of every curvature result of ``run``, index-major."""
    return [
        {"index": index, "epoch": epoch}
        for index in config["runs"][run]["indices"]
        for epoch in get_curvature_epochs(run)
    ]


def get_dossier_curvature(wildcards):
    """The curvature arrays the dossier reads (curvature and gradient norm, per index x epoch)."""
    return [
        layout.curvature_array(key, wildcards.run, **job)
        for job in dossier_curvature_jobs(wildcards.run)
        for key in ("curvature", "grad_norm")
    ]


def get_dossier_influence_metadata(wildcards):
    return (
        influence_files(wildcards.run, "metadata.json")
        if get_influence_epochs(wildcards.run)
        else []
    )


def get_dossier_influence_scores(wildcards):
    return (
        get_run_influence_scores(wildcards)
        if get_influence_epochs(wildcards.run)
        else []
    )


def get_dossier_params(wildcards):
    """What the dossier's table depends on besides its input files."""
    run = wildcards.run
    influence = bool(get_influence_epochs(run))
    return {
        "kind": get_dossier_kind(wildcards),
        "indices": list(config["runs"][run]["indices"]),
        "epochs": list(get_epochs(run)),
        "curvature": dossier_curvature_jobs(run),
        "influence": influence_jobs(run) if influence else [],
        "reduce": (
            get_run(wildcards)["influence"]["queries"]["reduce"] if influence else "max"
        ),
    }


#: Dossier kinds with a data map: a probability of the label, or a regression's error.
DATA_MAP_KINDS = ("classification", "text_classification", "regression")


def sample_figures():
    """The data map of every run whose samples have one (not a sequence model's)."""
    return [
        path
        for run in dossier_runs()
        if dossier_kind(run) in DATA_MAP_KINDS
        for path in layout.figures("data_map", run)
    ]


def sample_targets():
    """The dossier of every run that has one, and the data maps."""
    thumbnails = [
        layout.thumbnails(run)
        for run in dossier_runs()
        if dossier_kind(run)
        in ("classification", "regression")  # images or vectors, not text
    ]
    return (
        [layout.dossier(run) for run in dossier_runs()] + thumbnails + sample_figures()
    )
