# Helpers shared by the rules: config validation and the get_* functions that map wildcards to
# paths and parameters. The analysis code lives in src/epochlens; nothing here computes results.

import os
import sys
from functools import cache
from pathlib import Path

# Prefer the library next to this Snakefile over any other installed copy, here and in the jobs'
# scripts (which inherit the environment).
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
os.environ.update(
    PYTHONPATH=os.pathsep.join(filter(None, [_SRC, os.getenv("PYTHONPATH")]))
)

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from epochlens import config as run_config
from epochlens import curvature_io
from epochlens.data import cifar100_files
from epochlens.errors import EpochlensError
from epochlens.provenance import module_sources

SCHEMA = Path(workflow.basedir) / "config" / "schema.yaml"
SCRIPTS = Path(workflow.basedir) / "scripts"


def validate_config(cfg):
    """Schema check (fills defaults), then the checks a schema cannot express."""
    try:
        validate(cfg, SCHEMA)
    except WorkflowError:
        raise WorkflowError(run_config.explain_config_errors(cfg, SCHEMA)) from None
    for name, run in cfg["runs"].items():
        try:
            run_config.analysis_epochs(name, run)
            run_config.curvature_epochs(name, run)
            check_feature_config(name, run)
            check_influence_config(name, run)
        except EpochlensError as exc:
            raise WorkflowError(str(exc)) from None


def get_run(wildcards):
    return config["runs"][wildcards.run]


def get_run_params(run):
    """A run's config as the training and evaluation rules see it: without the analysis sections
    (curvature, features, probes, ablation, influence), so that changing them reruns neither
    training nor evaluation."""
    return {
        key: value
        for key, value in config["runs"][run].items()
        if key not in ("curvature", "features", "probes", "ablation", "influence")
    }


def get_eval_run(wildcards):
    return get_run_params(wildcards.run)


@cache
def get_epochs(run):
    """Checkpoint epochs analysed for ``run``."""
    return run_config.analysis_epochs(run, config["runs"][run])


def get_code(script):
    """A rule's script plus every epochlens module it imports: editing any of them reruns the rule."""
    path = SCRIPTS / script
    return [str(path)] + [str(p) for p in module_sources(path)]


def get_dataset(wildcards):
    return f"results/{wildcards.run}/data/dataset.h5"


def get_class_order(wildcards):
    return f"results/{wildcards.run}/index-{wildcards.index}/class_order.npy"


def get_data_source_files(wildcards):
    """The user's data files (so replacing them rebuilds dataset.h5); none for bundled digits."""
    data = get_run(wildcards)["data"]
    if data["source"] == "cifar100":
        return [str(p) for p in cifar100_files(data["path"])]
    if data["source"] == "npz":
        return [data["path"]]
    return []


def get_user_class_order(wildcards):
    spec = get_run(wildcards)["class_order"]
    if spec["source"] != "file":
        return []
    path = Path(spec["path"].format(index=int(wildcards.index)))
    if not path.is_file():
        raise WorkflowError(
            f"{path}: class order file not found (run {wildcards.run}, index {wildcards.index}). "
            "Fix class_order.path in the config or use class_order.source: seed."
        )
    return [str(path)]


def get_trained_runs():
    return [
        r
        for r, spec in config["runs"].items()
        if spec["checkpoints"]["source"] == "train"
    ]


def get_trained_checkpoints(run):
    """Output paths of run's training job (``{index}`` left as a wildcard)."""
    epochs = run_config.checkpoint_epochs(config["runs"][run])
    return [
        f"results/{run}/index-{{index}}/checkpoints/epoch_{e:04d}.pt" for e in epochs
    ]


def get_checkpoint(wildcards):
    """The checkpoint of (run, index, epoch): trained by the pipeline or in the user's folder."""
    ckpt = get_run(wildcards)["checkpoints"]
    if ckpt["source"] == "train":
        return (
            f"results/{wildcards.run}/index-{wildcards.index}/checkpoints/"
            f"epoch_{wildcards.epoch}.pt"
        )
    path = Path(
        ckpt["path"].format(index=int(wildcards.index), epoch=int(wildcards.epoch))
    )
    if not path.is_file():
        raise WorkflowError(
            f"{path}: checkpoint not found (run {wildcards.run}, index {wildcards.index}, epoch "
            f"{int(wildcards.epoch)}). Copy it from the training run, fix checkpoints.path, or "
            "restrict runs.<run>.epochs to the epochs you have."
        )
    return str(path)


def get_eval_tables(wildcards):
    run = wildcards.run
    return [
        f"results/{run}/index-{index}/eval/epoch_{epoch:04d}.csv"
        for index in config["runs"][run]["indices"]
        for epoch in get_epochs(run)
    ]


def get_data_params(wildcards):
    return get_run(wildcards)["data"]


def get_class_order_params(wildcards):
    return get_run(wildcards)["class_order"]


def get_epochs_per_task(wildcards):
    return get_run(wildcards)["schedule"]["epochs_per_task"]


def get_indices(wildcards):
    return get_run(wildcards)["indices"]


def get_train_logs(wildcards):
    return [
        f"results/{wildcards.run}/index-{index}/train_log.csv"
        for index in get_indices(wildcards)
    ]


def get_all_figures():
    """Every figure of every run; training curves only where the pipeline trains, curvature
    figures where curvature is computed."""
    trained = set(get_trained_runs())
    return (
        [
            f"results/{run}/figures/{name}.{ext}"
            for run in config["runs"]
            for name in ("accuracy_by_cohort", "training_curves")
            if name != "training_curves" or run in trained
            for ext in ("png", "pdf")
        ]
        + get_curvature_figures()
        + get_feature_figures()
        + get_influence_figures()
    )


@cache
def get_curvature_epochs(run):
    """Epochs of ``run`` whose curvature is computed (none when curvature is disabled)."""
    return run_config.curvature_epochs(run, config["runs"][run])


def get_curvature_shards(wildcards):
    """The shard files that curvature_epoch merges for (run, index, epoch)."""
    nshards = get_run(wildcards)["curvature"]["shards"]
    return [
        f"results/{wildcards.run}/index-{wildcards.index}/curvature/"
        f"epoch_{wildcards.epoch}/shards/shard_{k}-of-{nshards}.npz"
        for k in range(nshards)
    ]


def get_curvature_params(wildcards):
    """What curvature results depend on: estimator settings, model and class schedule.

    Only these (not the whole run config), so that changing e.g. curvature.epochs does not rerun
    the epochs already computed. Settings that do not change results (batch_size, processes) are
    not params either: the shard script reads them from the config, so changing them reruns nothing.
    """
    run = get_run(wildcards)
    settings = {
        key: run["curvature"][key]
        for key in (
            "h",
            "n_directions",
            "temperature",
            "norm",
            "mode",
            "seed",
        )
    }
    return {
        "settings": settings,
        "model": run["model"]["name"],
        "schedule": run["schedule"],
    }


def get_curvature_settings(wildcards):
    return get_curvature_params(wildcards)["settings"]


def get_curvature_model(wildcards):
    return get_curvature_params(wildcards)["model"]


def get_curvature_threads(wildcards):
    """CPU threads of a shard job: at least one per process."""
    return max(1, get_run(wildcards)["curvature"]["processes"])


def get_schedule(wildcards):
    return get_run(wildcards)["schedule"]


def get_curvature_runs():
    """Runs whose curvature is computed at one epoch or more."""
    return [run for run in config["runs"] if get_curvature_epochs(run)]


def get_curvature_epoch_files(run, index, names=("metadata.json",)):
    return [
        f"results/{run}/index-{index}/curvature/epoch_{epoch:04d}/{name}"
        for epoch in get_curvature_epochs(run)
        for name in names
    ]


def get_run_curvature_metadata(wildcards):
    """metadata.json of each (index, epoch) of a run, index-major (curvature_tables reads them so)."""
    return [
        path
        for index in get_indices(wildcards)
        for path in get_curvature_epoch_files(wildcards.run, index)
    ]


def get_run_curvature_arrays(wildcards):
    """Every per_image_*.npy file of the run, so that a rebuilt epoch reruns the tables."""
    names = [f"per_image_{key}.npy" for key in curvature_io.ARRAY_DTYPES]
    return [
        path
        for index in get_indices(wildcards)
        for path in get_curvature_epoch_files(wildcards.run, index, names)
    ]


def get_class_orders(wildcards):
    return [
        f"results/{wildcards.run}/index-{index}/class_order.npy"
        for index in get_indices(wildcards)
    ]


def get_run_curvature_epochs(wildcards):
    return get_curvature_epochs(wildcards.run)


def get_all_curvature():
    """Every curvature result: per-epoch files, tables and figures of every run."""
    per_epoch = [
        path
        for run in get_curvature_runs()
        for index in config["runs"][run]["indices"]
        for path in get_curvature_epoch_files(run, index)
    ]
    return per_epoch + get_curvature_figures()


def get_curvature_figures():
    return [
        f"results/{run}/figures/curvature_{name}.{ext}"
        for run in get_curvature_runs()
        for name in ("by_cohort", "distribution", "vs_loss")
        for ext in ("png", "pdf")
    ]


# ------------------------------------------------------------------------------------------------
# Cluster resources (profiles/slurm)
# ------------------------------------------------------------------------------------------------
# The SLURM profile sizes jobs by rule name (set-resources). The training rules are named after the
# config's runs (train_<run>), so a profile cannot name them: they declare their resources here.


def get_train_resources():
    """Resources of a training job on a cluster: one GPU (the standard `gpu` resource, which the
    SLURM executor requests with --gpus) with 4 CPU cores (--cpus-per-gpu), host memory in MB and
    wall time in minutes; the same as the GPU rules in profiles/slurm/config.yaml, except that the
    time does not grow with the attempt: a retried training resumes where it stopped. A profile
    overrides them per run with set-resources: train_<run>: {...}. Local runs ignore them unless
    --resources limits one (e.g. --resources gpu=1: one GPU job at a time on a one-GPU machine).
    """
    return {"gpu": 1, "cpus_per_gpu": 4, "mem_mb": 16000, "runtime": 240}


# ------------------------------------------------------------------------------------------------
# Features, probes, ablation
# ------------------------------------------------------------------------------------------------
# features_epoch -> features/epoch_{E}.h5 -> probes_epoch -> probes/epoch_{E}.csv -> probe_tables
# -> plot_probes; ablation_epoch -> ablation/epoch_{E}.csv -> ablation_tables -> plot_ablation.
# Params hold what changes results; batch_size and device are read from the config by the scripts.

from epochlens.features import FeatureSettings, available_layers, default_layers
from epochlens.models import build_model

# Settings of each section that change results (the rest are execution settings).
PROBE_SETTINGS = (
    "seeds",
    "stop_fraction",
    "max_epochs",
    "patience",
    "lr",
    "weight_decay",
    "batch_size",
)
ABLATION_SETTINGS = ("blocks", "channel_groups", "whole_blocks", "modes")


def check_feature_config(name, run):
    """Checks of the features, probes and ablation sections that the schema cannot express;
    errors name the key to fix."""
    run_config.section_epochs(name, run, "features")
    run_config.section_epochs(name, run, "ablation")
    if run["probes"]["enabled"] and not run["features"]["enabled"]:
        raise EpochlensError(
            f"runs.{name}.probes.enabled: probes need the features; set runs.{name}.features."
            f"enabled: true, or runs.{name}.probes.enabled: false."
        )
    ablation = run["ablation"]
    if ablation["channel_groups"] == 0 and not ablation["whole_blocks"]:
        raise EpochlensError(
            f"runs.{name}.ablation: channel_groups: 0 with whole_blocks: false leaves nothing to "
            "ablate; set one of them."
        )
    for section, key in (("features", "layers"), ("ablation", "blocks")):
        names = run[section][key]
        if run[section]["enabled"] and names:
            layers = get_model_layers(run["model"]["name"])
            unknown = [n for n in names if n not in layers]
            if unknown:
                default = get_model_layers(run["model"]["name"], default=True)
                raise EpochlensError(
                    f"runs.{name}.{section}.{key}: {run['model']['name']} has no module(s) "
                    f"{unknown}. Default (block outputs, also what null gives): {default}; "
                    f"all: {layers[:60]}."
                )


@cache
def get_model_layers(model_name, default=False):
    """Module names of a model (``default``: its block outputs), from a weightless copy."""
    import torch

    with torch.device("meta"):
        model = build_model(model_name, num_classes=10, in_channels=3)
    return default_layers(model) if default else available_layers(model)


@cache
def get_feature_epochs(run):
    """Epochs of ``run`` whose features are extracted (and probed)."""
    return run_config.section_epochs(run, config["runs"][run], "features")


@cache
def get_probe_epochs(run):
    return get_feature_epochs(run) if config["runs"][run]["probes"]["enabled"] else []


@cache
def get_ablation_epochs(run):
    return run_config.section_epochs(run, config["runs"][run], "ablation")


def get_model_name(wildcards):
    return get_run(wildcards)["model"]["name"]


def get_feature_settings(wildcards):
    """What the features depend on besides checkpoint and data: the cache key's spec.

    Spectral settings only when spectral features are asked for (as in the cache key), so that
    Snakemake reruns a job exactly when its file's key would change.
    """
    spec = get_run(wildcards)["features"]
    names = list(spec["representations"])
    reps = {"names": names}
    if "spectral" in names:
        reps.update(
            spectral_k=spec["spectral_k"], spectral_method=spec["spectral_method"]
        )
    return {"layers": spec["layers"], "representations": reps, "dtype": spec["dtype"]}


def get_probe_params(wildcards):
    spec = get_run(wildcards)["probes"]
    return {
        "settings": {key: spec[key] for key in PROBE_SETTINGS},
        "targets": spec["targets"],
        "curvature_bins": spec["curvature_bins"],
    }


def get_probe_curvature(wildcards):
    """per_image_curvature.npy of (run, index, epoch) where the curvature target is asked for and
    curvature is computed at that epoch; none otherwise (the probes skip the target and say so).
    """
    spec = get_run(wildcards)["probes"]
    if "curvature" not in spec["targets"]:
        return []
    if int(wildcards.epoch) not in get_curvature_epochs(wildcards.run):
        return []
    return [
        f"results/{wildcards.run}/index-{wildcards.index}/curvature/"
        f"epoch_{wildcards.epoch}/per_image_curvature.npy"
    ]


def get_ablation_params(wildcards):
    spec = get_run(wildcards)["ablation"]
    return {
        "settings": {key: spec[key] for key in ABLATION_SETTINGS},
        "split": spec["split"],
        "mean_samples": spec["mean_samples"] if "mean" in spec["modes"] else None,
    }


def get_epoch_files(run, folder, epochs, ext):
    return [
        f"results/{run}/index-{index}/{folder}/epoch_{epoch:04d}.{ext}"
        for index in config["runs"][run]["indices"]
        for epoch in epochs
    ]


def get_run_probe_tables(wildcards):
    return get_epoch_files(
        wildcards.run, "probes", get_probe_epochs(wildcards.run), "csv"
    )


def get_run_ablation_tables(wildcards):
    return get_epoch_files(
        wildcards.run, "ablation", get_ablation_epochs(wildcards.run), "csv"
    )


def get_all_features():
    """Every features file of every run."""
    return [
        path
        for run in config["runs"]
        for path in get_epoch_files(run, "features", get_feature_epochs(run), "h5")
    ]


def get_figure_files(run, name):
    return [f"results/{run}/figures/{name}.{ext}" for ext in ("png", "pdf")]


def get_all_probes():
    """Every probe result: per-epoch tables, the run's table and its figure."""
    return [
        path
        for run in config["runs"]
        if get_probe_epochs(run)
        for path in get_epoch_files(run, "probes", get_probe_epochs(run), "csv")
        + [f"results/{run}/tables/probes.csv"]
        + get_figure_files(run, "probe_accuracy")
    ]


def get_all_ablation():
    """Every ablation result: per-epoch tables, the run's table and its figure."""
    return [
        path
        for run in config["runs"]
        if get_ablation_epochs(run)
        for path in get_epoch_files(run, "ablation", get_ablation_epochs(run), "csv")
        + [f"results/{run}/tables/ablation.csv"]
        + get_figure_files(run, "ablation_effect")
    ]


def get_feature_figures():
    """Probe and ablation figures of every run that has them."""
    return [
        path for path in get_all_probes() + get_all_ablation() if "/figures/" in path
    ]


def get_all_feature_analyses():
    """Features, probes and ablations: what `rule all` asks for."""
    return get_all_features() + get_all_probes() + get_all_ablation()


# ------------------------------------------------------------------------------------------------
# Influence and data quality
# ------------------------------------------------------------------------------------------------
# prepare_data applies data.corruption and records the corrupted positions (rules/data.smk). Per
# (run, index, epoch, method), in results/{run}/index-{index}/influence/epoch_{E}/{method}/:
# influence_factors (ekfac, kfac, diagonal) -> factors.pt, factor_diagnostics.csv; influence_scores
# (every method) -> scores.npz, metadata.json, diagnostics.csv. Per run: poison_detection -> tables,
# plot_influence -> figures. Params hold what changes results; the batch sizes are read from the
# config by the scripts, so changing them reruns nothing.

from types import SimpleNamespace

INFLUENCE_FACTOR_METHODS = ("ekfac", "kfac", "diagonal")
# Settings that change the fitted factors; damping and the rest change only the scores.
INFLUENCE_FACTOR_SETTINGS = ("fisher", "layers", "exclude_layers", "seed")
INFLUENCE_SCORE_SETTINGS = (
    "damping",
    "damping_mode",
    "precondition_dtype",
    "queries",
    "transforms",
    "noise_std",
    "crop_pad",
    "transform_seed",
)
INFLUENCE_FIGURES = ("poison_roc", "top_influential_images", "influence_conditioning")


def influence_epochs(name, run):
    """Epochs of run ``name`` whose influence is computed: influence.epochs, or the last analysed
    epoch; none when influence is disabled."""
    spec = run.get("influence") or {}
    if not spec.get("enabled", False):
        return []
    analysed = run_config.analysis_epochs(name, run)
    chosen = spec.get("epochs") or [analysed[-1]]
    unknown = sorted(set(chosen) - set(analysed))
    if unknown:
        raise EpochlensError(
            f"runs.{name}.influence.epochs: {unknown} are not analysed epochs of this run "
            f"({analysed}); pick from those or change runs.{name}.epochs."
        )
    return sorted(chosen)


def influence_tracin_epochs(name, run, epoch):
    """Checkpoints whose gradient dot products TracIn sums for influence at ``epoch``: those of
    influence.tracin_epochs up to it, or every analysed epoch after the first up to it.
    """
    analysed = run_config.analysis_epochs(name, run)
    chosen = run["influence"].get("tracin_epochs")
    if chosen is None:
        return [e for e in analysed if analysed[0] < e <= epoch] or [epoch]
    unknown = sorted(set(chosen) - set(analysed))
    if unknown:
        raise EpochlensError(
            f"runs.{name}.influence.tracin_epochs: {unknown} are not analysed epochs of this run "
            f"({analysed}); pick from those."
        )
    upto = sorted(e for e in chosen if e <= epoch)
    if not upto:
        raise EpochlensError(
            f"runs.{name}.influence.tracin_epochs: none is at or before influence epoch {epoch}; "
            "add one, or leave tracin_epochs: null."
        )
    return upto


def check_influence_config(name, run):
    """Checks of the influence and data.corruption sections that the schema cannot express;
    errors name the key to fix."""
    epochs = influence_epochs(name, run)
    spec = run["influence"]
    if "tracin" in spec["methods"]:
        for epoch in epochs:
            influence_tracin_epochs(name, run, epoch)
    corruption = run["data"].get("corruption") or {"kind": "none"}
    if spec["queries"]["trigger"] and corruption["kind"] != "trigger":
        raise EpochlensError(
            f"runs.{name}.influence.queries.trigger: true needs a trigger to stamp; set "
            f"runs.{name}.data.corruption.kind: trigger, or queries.trigger: null."
        )
    if corruption["kind"] == "trigger":
        classes = run_config.num_classes(run["data"])
        if corruption["target_class"] >= classes:
            raise EpochlensError(
                f"runs.{name}.data.corruption.target_class: {corruption['target_class']} is not a "
                f"class of this data set (0..{classes - 1})."
            )


@cache
def get_influence_epochs(run):
    return influence_epochs(run, config["runs"][run])


def get_influence_runs():
    """Runs whose influence is computed at one epoch or more."""
    return [run for run in config["runs"] if get_influence_epochs(run)]


def get_influence_dir(run, index, epoch, method):
    return f"results/{run}/index-{index}/influence/epoch_{int(epoch):04d}/{method}"


def get_corruption(wildcards):
    """data.corruption of the run (kind none when absent)."""
    return get_run(wildcards)["data"].get("corruption") or {"kind": "none"}


def get_corrupted_indices(wildcards):
    return f"results/{wildcards.run}/data/corrupted_indices.npy"


def get_influence_settings(wildcards):
    """The influence settings that change the scores of (run, method): factor settings (none for
    identity and tracin, which fit nothing) and score settings."""
    spec = get_run(wildcards)["influence"]
    method = wildcards.method
    settings = {"method": method}
    if method in INFLUENCE_FACTOR_METHODS:
        settings.update({key: spec[key] for key in INFLUENCE_FACTOR_SETTINGS})
        settings["fisher"] = "true" if spec["fisher"] is True else spec["fisher"]
    else:
        settings.update(layers=spec["layers"], exclude_layers=spec["exclude_layers"])
    return settings


def get_influence_factor_params(wildcards):
    """What fitted factors depend on: method, Fisher type, layers, seed, model and schedule."""
    settings = get_influence_settings(wildcards)
    return {
        "settings": settings,
        "model": get_run(wildcards)["model"]["name"],
        "schedule": get_schedule(wildcards),
    }


def get_influence_score_params(wildcards):
    """What scores depend on: the factors' params, damping, queries, transforms, TracIn epochs and
    the corruption (trigger queries)."""
    spec = get_run(wildcards)["influence"]
    params = get_influence_factor_params(wildcards)
    params["settings"].update(
        {
            key: spec[key]
            for key in INFLUENCE_SCORE_SETTINGS
            # identity and tracin invert no curvature: damping does not change their scores
            if wildcards.method in INFLUENCE_FACTOR_METHODS
            or not key.startswith("damping")
        }
    )
    # How the scores are reduced over the queries changes the tables only.
    params["settings"]["queries"] = {
        key: value for key, value in spec["queries"].items() if key != "reduce"
    }
    params["tracin_epochs"] = get_influence_tracin_epochs(wildcards)
    params["corruption"] = get_corruption(wildcards)
    return params


def get_influence_tracin_epochs(wildcards):
    if wildcards.method != "tracin":
        return []
    return influence_tracin_epochs(
        wildcards.run, get_run(wildcards), int(wildcards.epoch)
    )


def get_influence_tracin_checkpoints(wildcards):
    """Checkpoints of the TracIn sum (none for the other methods)."""
    return [
        get_checkpoint(
            SimpleNamespace(run=wildcards.run, index=wildcards.index, epoch=f"{e:04d}")
        )
        for e in get_influence_tracin_epochs(wildcards)
    ]


def get_influence_factors(wildcards):
    """factors.pt of (run, index, epoch, method); none for identity and tracin."""
    if wildcards.method not in INFLUENCE_FACTOR_METHODS:
        return []
    folder = get_influence_dir(
        wildcards.run, wildcards.index, wildcards.epoch, wildcards.method
    )
    return [f"{folder}/factors.pt"]


def get_influence_jobs(run):
    """(index, epoch, method) of every influence_scores job of ``run``, index-major."""
    spec = config["runs"][run]["influence"]
    return [
        {"index": index, "epoch": epoch, "method": method}
        for index in config["runs"][run]["indices"]
        for epoch in get_influence_epochs(run)
        for method in spec["methods"]
    ]


def get_run_influence_jobs(wildcards):
    return get_influence_jobs(wildcards.run)


def get_influence_files(run, name):
    return [
        f"{get_influence_dir(run, j['index'], j['epoch'], j['method'])}/{name}"
        for j in get_influence_jobs(run)
    ]


def get_run_influence_scores(wildcards):
    return get_influence_files(wildcards.run, "scores.npz")


def get_run_influence_diagnostics(wildcards):
    return get_influence_files(wildcards.run, "diagnostics.csv")


def get_poison_detection_params(wildcards):
    spec = get_run(wildcards)["influence"]
    return {
        "seed": spec["seed"],
        "top_k": spec["top_k"],
        "reduce": spec["queries"]["reduce"],
    }


def get_influence_figures():
    return [
        path
        for run in get_influence_runs()
        for name in INFLUENCE_FIGURES
        for ext in ("png", "pdf")
        for path in [f"results/{run}/figures/{name}.{ext}"]
    ]


def get_all_influence():
    """Every influence result: per-epoch scores, the study's tables and figures of every run."""
    return [
        path
        for run in get_influence_runs()
        for path in get_influence_files(run, "metadata.json")
        + [f"results/{run}/tables/poison_detection.csv"]
    ] + get_influence_figures()
