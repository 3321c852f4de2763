# Helpers of rules/features.smk: input functions, params and targets.

import re

from epochlens.config.run_kinds import is_text_run
from epochlens.features.stored_settings import decoded_once
from epochlens.features.text_settings import text_feature_params
from epochlens.layout import representation_name


@cache
def get_feature_epochs(run):
    """Epochs of ``run`` whose features are extracted (and probed)."""
    return run_config.section_epochs(run, config["runs"][run], "features")


def get_feature_params(wildcards):
    """The cache key's spec; a text run's representations are those of its kind (of each block:
    epochlens.features.text_settings.text_feature_params)."""
    run = get_run(wildcards)
    if is_text_run(run):
        return text_feature_params(run)
    return run_config.feature_params(run)


def is_stored(run):
    """Whether ``run``'s features come from stored activations (one job per representation)."""
    return run_config.is_stored_run(config["runs"][run])


def per_representation(run, path, epochs):
    """``path(run, index, epoch, representation)`` for every index of a stored run, each of
    ``epochs`` and each of its representations: the unit of work of a run of stored activations.
    """
    return [
        path(run, index, epoch, representation)
        for index in config["runs"][run]["indices"]
        for epoch in epochs
        for representation in run_config.stored_representations(config["runs"][run])
    ]


def feature_files(run):
    """The features files of ``run``: one per checkpoint, or per (snapshot, representation) of a run
    of stored activations."""
    epochs = get_feature_epochs(run)
    if is_stored(run):
        return per_representation(run, layout.stored_features, epochs)
    return per_checkpoint(run, layout.features, epochs)


def feature_targets():
    """Every features file of every run."""
    return [path for run in config["runs"] for path in feature_files(run)]


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


def is_decoded(wildcards):
    """Whether the snapshot of (run, epoch) is parquet, decoded once for every representation
    (epochlens.features.stored_settings.decoded_once)."""
    return snapshot_decoded(
        get_snapshot(wildcards), get_run(wildcards)["checkpoints"]["format"]
    )


@cache
def snapshot_decoded(folder, file_format):
    """decoded_once, looked up once per snapshot folder: each of its representations' jobs asks
    twice (input and params), and with format auto each answer searches the folder's files.
    """
    return decoded_once(folder, file_format)


def get_stored_snapshot(wildcards):
    """The folder a representation's features are read from: the snapshot, or its decoded
    layers where it is parquet (rule activations_decoded)."""
    if is_decoded(wildcards):
        return layout.decoded_activations(
            wildcards.run, wildcards.index, wildcards.epoch
        )
    return get_snapshot(wildcards)


def get_decode_params(wildcards):
    """What a decode depends on: the layers asked for and the id column."""
    run = get_run(wildcards)
    return {
        "layers": run["features"]["layers"],
        "id_column": run["checkpoints"]["id_column"],
    }


def get_representation(wildcards):
    """The representation of a stored run's job, from its file name (layout.representation_file)."""
    return representation_name(wildcards.representation)


def get_stored_feature_params(wildcards):
    """The spec of one representation's features (that representation only)."""
    params = run_config.stored_feature_params(
        get_run(wildcards), get_representation(wildcards)
    )
    if is_decoded(wildcards):
        params["file_format"] = "npy"
    return params


def get_stored_code(wildcards):
    """A user representation's source files: inputs of its own features jobs only."""
    return run_config.stored_code(get_run(wildcards), get_representation(wildcards))
