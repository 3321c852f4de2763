"""Which settings change a stage's results: the rules' params, derived from the settings dataclasses.

A rule's params are what its results depend on besides its input files; Snakemake reruns a job
when they change. Each stage's settings dataclass knows its fields; a field whose metadata says
``execution`` (batch sizes, threads, compression) changes how the work is done, not the numbers,
and one that says ``tables`` changes only the run's tables downstream. :func:`result_settings`
keeps the other fields that a config section sets, in the dataclass's field order, so that adding
a field to a dataclass (and the schema) makes it a param without a second list to keep in step.
``device`` is an execution setting of every stage: the jobs read it from the config and record it
in their metadata; it is never a param.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields

from epochlens.ablation.settings import AblationSettings
from epochlens.config import epochs
from epochlens.config.run_kinds import has_token_labels, is_regression_run
from epochlens.curvature.settings import CurvatureSettings
from epochlens.errors import ConfigError
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.influence.projection_settings import PROJECTED_METHODS, ProjectionSettings
from epochlens.influence.settings import FACTOR_METHODS, InfluenceSettings
from epochlens.outcome import regression_reduction
from epochlens.probes.settings import ProbeSettings, probe_targets
from epochlens.schedule import is_no_schedule
from epochlens.study.lds import LdsSettings
from epochlens.study.settings import QuerySettings, QueryTransformSettings

#: Methods scored from gradient stores (logra, with the store's curvature; tracin_rp, a store at
#: each of its checkpoints), and those summing over the checkpoints of influence.tracin_epochs.
STORE_METHODS, TRACIN_METHODS = (*PROJECTED_METHODS, "tracin_rp"), ("tracin", "tracin_rp")

#: Curvature settings of a regression only (a classifier's params leave them out).
REGRESSION_FIELDS = ("tolerance", "reduction")

#: Sections of a run that only analyses read: training and evaluation never see them.
ANALYSIS_SECTIONS = ("curvature", "features", "probes", "ablation", "influence", "samples")


def result_settings(section: Mapping, settings_class: type, exclude: Iterable[str] = ()) -> dict:
    """``{field: section[field]}`` for the fields of ``settings_class`` (a stage's settings
    dataclass) present in ``section`` (a config section, e.g. ``config["runs"][run]["curvature"]``)
    whose metadata marks neither ``execution`` nor ``tables``, in the dataclass's field order, but
    those in ``exclude``."""
    skip = set(exclude)
    return {
        f.name: section[f.name]
        for f in fields(settings_class)
        if f.name in section
        and f.name not in skip
        and not f.metadata.get("execution")
        and not f.metadata.get("tables")
    }


def run_params(run: Mapping) -> dict:
    """A run's config as training and evaluation see it: without the analysis sections, so that
    changing them reruns neither training nor evaluation (its ``schedule``: :func:`class_schedule`)."""
    params = {key: value for key, value in run.items() if key not in ANALYSIS_SECTIONS}
    return {**params, "schedule": class_schedule(run)}


def class_schedule(run: Mapping) -> dict | None:
    """The run's ``schedule`` section as its checkpoint jobs read it: None for a causal LM run or
    a regression, whose samples have no classes (:mod:`epochlens.outcome`), and for a
    text-to-text run read from folders; a text-to-text run the pipeline trains keeps its one-class
    schedule (class 0, the target tokens, at every epoch), which says its epochs."""
    if is_regression_run(dict(run)) or (has_token_labels(dict(run)) and is_no_schedule(run["schedule"])):
        return None
    return run["schedule"]


def model_param(run: Mapping) -> str | dict:
    """What a job's model depends on besides its checkpoint file: the built-in network's name, or
    your model's section (factory, kwargs, output, project_path) with the checkpoint reading
    (checkpoints.key, strip_prefix) — a mapping that :func:`epochlens.job.load_checkpoint_job`
    takes as ``model``. A built-in read without key or prefix stays its name (results of existing
    runs keep their params)."""
    model = dict(run["model"])
    ckpt = run.get("checkpoints", {})
    reading = {k: ckpt.get(k) for k in ("key", "strip_prefix") if ckpt.get(k)}
    if "name" in model and not reading:
        return model["name"]
    return {**model, **reading}


def curvature_params(run: Mapping) -> dict:
    """What curvature results depend on: estimator settings, model and class schedule.

    Not the whole run config, so that changing e.g. curvature.epochs does not rerun the epochs
    already computed, nor batch_size or processes (execution settings).
    """
    if is_regression_run(dict(run)):  # the squared error's reduction comes from the task
        settings = {
            **result_settings(run["curvature"], CurvatureSettings),
            "reduction": regression_reduction(run["task"]),
        }
    else:  # a classifier's results do not depend on the regression fields
        settings = result_settings(run["curvature"], CurvatureSettings, exclude=REGRESSION_FIELDS)
    return {
        "settings": settings,
        "model": model_param(run),
        "schedule": class_schedule(run),  # a classifier's schedule section; None for a causal LM
    }


def feature_params(run: Mapping) -> dict:
    """What the features depend on besides checkpoint and data: the cache key's spec.

    Spectral settings only when spectral features are asked for (as in the cache key), so that
    Snakemake reruns a job exactly when its file's key would change.
    """
    spec = run["features"]
    settings = result_settings(spec, FeatureSettings)
    reps = {"names": list(settings["representations"])}
    if "spectral" in reps["names"]:
        reps.update(result_settings(spec, RepresentationSettings, exclude=("names",)))
    params = {"layers": settings["layers"], "representations": reps, "dtype": settings["dtype"]}
    if settings.get("precision", "float32") != "float32":  # as in the cache key: float32 runs keep theirs
        params["precision"] = settings["precision"]
    return params


def stored_representations(run: Mapping) -> list[str]:
    """The representations of a run of stored activations (each its own features and probe jobs)."""
    return list(run["features"]["representations"])


def _stored_representation(run: Mapping, representation: str) -> str:
    if representation not in stored_representations(run):
        raise ConfigError(
            f"representation {representation!r} is not in features.representations "
            f"{stored_representations(run)}; ask for one of those."
        )
    return representation


def stored_feature_params(run: Mapping, representation: str) -> dict:
    """The :class:`StoredFeatureSettings` of one representation's features of a run of stored
    activations (the cache key's spec): that representation only, a user function with the hash of
    its source files, so that editing it changes this representation's params and no other's."""
    from epochlens.features.stored_settings import is_user_representation
    from epochlens.formats.factory import FactorySpec, factory_fingerprint

    spec, ckpt = run["features"], run["checkpoints"]
    rep = _stored_representation(run, representation)
    params = {
        "layers": spec["layers"],
        "representations": [rep],
        "file_format": ckpt["format"],
        "id_column": ckpt["id_column"],
        "dtype": spec["dtype"],
    }
    if is_user_representation(rep):  # where it is imported from, and its source files' hash
        params["project_path"] = spec.get("project_path")
        factory = FactorySpec(factory=rep, project_path=spec.get("project_path"))
        params["user_code"] = {rep: factory_fingerprint(factory)}
    if rep == "spectral":  # the settings of spectral only: changing them reruns no other
        params.update(spectral_k=spec["spectral_k"], spectral_method=spec["spectral_method"])
    return params


def stored_code(run: Mapping, representation: str) -> list[str]:
    """A user representation's source files (inputs of its own features jobs); none for a built-in."""
    from epochlens.features.stored_settings import is_user_representation
    from epochlens.formats.factory import FactorySpec, factory_sources

    rep = _stored_representation(run, representation)
    if not is_user_representation(rep):
        return []
    spec = FactorySpec(factory=rep, project_path=run["features"].get("project_path"))
    return sorted(str(p) for p in factory_sources(spec))


def probe_params(run: Mapping) -> dict:
    """What probe results depend on: the probe settings, targets (``probes.targets``, or the run's
    kind's defaults, :func:`epochlens.probes.settings.probe_targets`) and quantile bins.

    A classifier's params are those it had before regressions were probed (no ridge penalties, no
    target bins), so existing runs keep them; a regression's add ``target_bins``. ``batch_order``
    is a param where it is ``shared`` and softmax probes run (``per_seed``, the default, set or
    not, changes nothing).
    """
    spec = run["probes"]
    regression = is_regression_run(dict(run))
    ridge = regression or spec.get("kind") == "ridge"  # a classifier's ridge probes: their penalties
    exclude = [] if ridge else ["ridge_alphas"]
    if spec.get("batch_order", "per_seed") == "per_seed" or spec.get("kind") == "ridge":
        exclude.append("batch_order")  # the default, set or not, or no softmax probe: no rerun
    params = {
        "settings": result_settings(spec, ProbeSettings, exclude=exclude),
        "targets": probe_targets(spec["targets"], regression, has_token_labels(dict(run))),
        "curvature_bins": spec["curvature_bins"],
    }
    if regression:
        params["target_bins"] = spec["target_bins"]
    return params


def ablation_params(run: Mapping) -> dict:
    """What ablation results depend on: unit groups and modes, the split, the mean's images (and a
    regression's loss reduction)."""
    spec = run["ablation"]
    params = {
        "settings": result_settings(spec, AblationSettings),
        "split": spec["split"],
        "mean_samples": spec["mean_samples"] if "mean" in spec["modes"] else None,
    }
    if is_regression_run(dict(run)):  # the squared error's reduction (a classifier's params: unchanged)
        params["reduction"] = regression_reduction(run["task"])
    return params


def _factor_fields() -> set[str]:
    """Fields of :class:`InfluenceSettings` that the fitted factors depend on (its factor key)."""
    return set(InfluenceSettings().factor_key()) - {"scheme"}


def influence_settings(run: Mapping, method: str) -> dict:
    """The settings that change ``method``'s factors or store: the factor fields (the layers alone
    for identity and tracin, which fit nothing; the store's for logra, trak and tracin_rp)."""
    spec = run["influence"]
    settings = {"method": method}
    fisher = "true" if spec["fisher"] is True else spec["fisher"]  # YAML's bare true
    if method in FACTOR_METHODS:
        settings.update(result_settings(spec, InfluenceSettings, exclude={"method"} | _score_fields()))
        settings["fisher"] = fisher
    else:
        settings.update(layers=spec["layers"], exclude_layers=spec["exclude_layers"])
    if method in STORE_METHODS:  # the store's gradients: the Fisher's draws and the projection
        settings.update(fisher=fisher, seed=spec["seed"])
        skip = {"seed", "precondition", "dim" if method == "trak" else "trak_dim"}  # precondition: rescores
        settings["projection"] = result_settings(spec["projection"], ProjectionSettings, exclude=skip)
    return settings


def _score_fields() -> set[str]:
    return {f.name for f in fields(InfluenceSettings)} - _factor_fields()


def influence_factor_params(run: Mapping, method: str) -> dict:
    """What fitted factors depend on: method, Fisher type, layers, seed, model, schedule and the
    run's task (the loss whose curvature they are)."""
    return {
        "settings": influence_settings(run, method),
        "model": model_param(run),
        "schedule": class_schedule(run),  # a classifier's schedule section; None for a regression
        "task": run["task"],
    }


def influence_curvature_params(run: Mapping, method: str) -> dict:
    """What a projected method's curvature depends on: its store's params and how it preconditions."""
    params = influence_factor_params(run, method)
    params["settings"]["projection"]["precondition"] = run["influence"]["projection"]["precondition"]
    return params


def influence_score_params(name: str, run: Mapping, method: str, epoch: int) -> dict:
    """What scores depend on: the factors' params, damping (methods that invert a curvature), the
    queries and their transforms, TracIn's checkpoints and the corruption (trigger queries)."""
    spec, projected = run["influence"], method in PROJECTED_METHODS
    params = (influence_curvature_params if projected else influence_factor_params)(run, method)
    score = result_settings(spec, InfluenceSettings, exclude=_factor_fields())
    if method not in FACTOR_METHODS + PROJECTED_METHODS:  # identity and tracin invert no curvature
        score = {k: v for k, v in score.items() if not k.startswith("damping")}
    if method in STORE_METHODS:  # scored in float64 from the store, never low-rank; whole to pairwise_gb
        score = {k: v for k, v in score.items() if k not in ("query_gradient_rank", "precondition_dtype")}
        params["settings"]["projection"]["pairwise_gb"] = spec["projection"]["pairwise_gb"]
    params["settings"].update(score)
    params["settings"]["queries"] = result_settings(spec["queries"], QuerySettings)  # reduce: tables only
    params["settings"].update(result_settings(spec, QueryTransformSettings))
    params["tracin_epochs"] = epochs.tracin_epochs(name, run, epoch) if method in TRACIN_METHODS else []
    params["corruption"] = corruption(run)
    return params


def corruption(run: Mapping) -> dict:
    """``data.corruption`` of the run (kind none when absent)."""
    return run["data"].get("corruption") or {"kind": "none"}


def poison_detection_params(run: Mapping) -> dict:
    """What the detection tables depend on besides the scores: baseline seed, top k, reduction."""
    spec = run["influence"]
    return {"seed": spec["seed"], "top_k": spec["top_k"], "reduce": spec["queries"]["reduce"]}


def lds_retrain_params(run: Mapping) -> dict:
    """What the LDS retrainings depend on: the run's training recipe, data, model and schedule
    (as the training job's params) and the subsets (count, fraction, seed); not how they are split
    into jobs, nor the bootstrap of the tables.

    A run trained by its own command (``checkpoints.source: command``): what its training jobs
    depend on besides their files and data (:func:`epochlens.formats.command.command_params`),
    the model and task its checkpoints are measured with and its class schedule (None for a
    regression); the command's files and ``{data}`` are the jobs' inputs."""
    lds = result_settings(run["influence"]["lds"], LdsSettings)
    if run["checkpoints"]["source"] == "command":
        from epochlens.formats.command import command_params

        measured = {"model": model_param(run), "task": run.get("task", "classification")}
        spec = {"command": command_params(run), **measured, "schedule": class_schedule(run)}
        return {"run": spec, "lds": lds}
    return {"run": run_params(run), "lds": lds}


def lds_table_params(run: Mapping) -> dict:
    """``influence.lds`` as the LDS tables read it (fraction, parts, bootstrap, seed)."""
    return dict(run["influence"]["lds"])
