"""Checks of a run's configuration that the schema cannot express (torch-free).

They run while the workflow is planned, before any job: each error names the config key to fix.
Layer names of the built-in models are checked against :mod:`epochlens.models.catalog`; other
models are checked when their job builds them.
"""

from __future__ import annotations

import os
from pathlib import Path

from epochlens.config import epochs
from epochlens.config.influence_checks import (  # noqa: F401 (moved there; importable here too)
    check_influence_config,
    check_lds_config,
    check_trigger_config,
    unknown_words,
)
from epochlens.config.run_kinds import (  # noqa: F401 (moved there; importable here too)
    REGRESSION_CORRUPTIONS,
    REGRESSION_SOURCES,
    REGRESSION_TRANSFORMS,
    has_token_labels,
    is_causal_lm_run,
    is_regression_run,
    is_stored_run,
    is_text_run,
    is_text_to_text_run,
    task_name,
)
from epochlens.config.stored_checks import check_stored_config
from epochlens.errors import ConfigError
from epochlens.models.catalog import DEFAULT_LAYERS, known_layers
from epochlens.study.settings import IMAGE_QUERY_TRANSFORMS, TEXT_QUERY_TRANSFORMS


def check_run(name: str, run: dict) -> None:
    """Every cross-field check of run ``name`` (defaults filled in); raises ConfigError."""
    check_checkpoint_config(name, run)
    if is_stored_run(run):
        check_stored_config(name, run)
        check_probe_config(name, run)
        return
    if "model" not in run:
        raise ConfigError(
            f"runs.{name}.model: a run needs its model (name, factory or hf), unless its features "
            "come from stored activations (checkpoints.source: activations)."
        )
    check_model_config(name, run)
    check_text_config(name, run)
    check_regression_config(name, run)
    check_ground_truth_config(name, run)
    check_hf_checkpoint_task(name, run)
    epochs.analysis_epochs(name, run)
    epochs.curvature_epochs(name, run)
    check_feature_config(name, run)
    check_influence_config(name, run)


def check_checkpoint_config(name: str, run: dict) -> None:
    """A folder of checkpoints without {index} in its path holds one replicate; a training command
    (:func:`check_command_config`)."""
    ckpt = run["checkpoints"]
    if ckpt["source"] == "command":
        check_command_config(name, run)
    if ckpt["source"] == "folder" and "{index" not in ckpt["path"] and len(run["indices"]) > 1:
        raise ConfigError(
            f"runs.{name}.checkpoints.path has no {{index}} placeholder, so it holds one replicate, "
            f"but runs.{name}.indices lists {run['indices']}; add {{index}} to the path or keep one index."
        )


def check_command_config(name: str, run: dict) -> None:
    """``checkpoints.source: command``: the epochs it writes listed, a template whose placeholders
    exist, and what such a run cannot have yet (torch-free; the files and the git repository are
    checked when the workflow plans the run's training jobs)."""
    from epochlens.formats.command import CommandError, CommandSpec

    key = f"runs.{name}"
    if not run.get("epochs"):
        raise ConfigError(
            f"{key}.epochs: checkpoints.source: command needs the epochs whose checkpoints the "
            f"command writes (e.g. epochs: [0, 50, 100]): the pipeline plans them before it runs."
        )
    try:
        CommandSpec.from_config(name, run).check()
    except CommandError as exc:
        raise ConfigError(str(exc)) from None
    if is_text_run(run):
        raise ConfigError(
            f"{key}.checkpoints.source: command is for array data (images, vectors) so far; a text "
            "run's checkpoints are read from a folder (source: folder) or trained by the pipeline."
        )
    if run["schedule"].get("initial_classes") is not None:
        raise ConfigError(
            f"{key}.schedule: a training command's run has schedule: none (a class-incremental "
            "schedule follows the pipeline's class order, which the command is not given)."
        )


def check_model_config(name: str, run: dict) -> None:
    """Your own model: read from your checkpoints or those your training command writes (the
    pipeline trains built-in networks only), and a factory whose module is found under
    model.project_path (nothing is imported here)."""
    model = run["model"]
    if "factory" not in model:
        return
    if run["checkpoints"]["source"] not in ("folder", "command"):
        raise ConfigError(
            f"runs.{name}.model.factory: the pipeline trains the built-in networks only; analyse "
            f"your model's checkpoints with runs.{name}.checkpoints: {{source: folder, path: ...}}, "
            f'or have it run your training script (source: command; README "Your own training script").'
        )
    from epochlens.formats.factory import FactoryError, FactorySpec, factory_sources

    try:
        factory_sources(FactorySpec.from_config(model))
    except FactoryError as exc:
        raise ConfigError(f"runs.{name}.model: {exc}") from None


def check_regression_config(name: str, run: dict) -> None:
    """A regression run (or float targets without one): every key that must change, at once, and
    the data's kind against the task where the data is cheap to read (an .npz's labels)."""
    data, regression = run["data"], is_regression_run(run)
    corruption = (data.get("corruption") or {"kind": "none"})["kind"]
    if not regression:
        if corruption == "target_noise":
            raise ConfigError(
                f"runs.{name}.data.corruption.kind: target_noise adds noise to regression targets; "
                "this run's task is not regression (use label_flip or trigger)."
            )
        if data["source"] == "npz":
            check_npz_kind(name, data, task_name(run))
        return
    problems = []
    if data["source"] not in REGRESSION_SOURCES or "text" in data:
        problems.append(
            f"data.source: one of {list(REGRESSION_SOURCES)} holding float targets ({data['source']} "
            "data has class labels)"
        )
    elif data["source"] != "npz" and "table" not in data:
        problems.append("data.table: the columns of the inputs and targets (a tabular data set)")
    if "factory" not in run["model"]:
        problems.append("model.factory: your regression model (the built-in networks are classifiers)")
    if run["schedule"].get("initial_classes", 0) is not None:
        problems.append("schedule: none (a regression's samples have no classes to introduce over time)")
    if corruption not in REGRESSION_CORRUPTIONS:
        problems.append(f"data.corruption.kind: one of {list(REGRESSION_CORRUPTIONS)} (not {corruption})")
    if problems:
        raise ConfigError(f"runs.{name} is a regression (task: regression); set " + "; ".join(problems) + ".")
    if data["source"] == "npz":
        check_npz_kind(name, data, "regression")


def check_hf_checkpoint_task(name: str, run: dict) -> None:
    """A transformer read from your checkpoint folders: the first one's config.json must name a
    model that model.hf.task can load (its head, or a text-to-text model), before any job."""
    hf, ckpt = run["model"].get("hf"), run["checkpoints"]
    if hf is None or ckpt["source"] != "folder":
        return
    from epochlens.models.hf_heads import task_problem

    found = epochs.checkpoint_epochs(run)
    if not found:
        return
    folder = Path(ckpt["path"].format(index=run["indices"][0], epoch=found[0]))
    config_file = folder / "config.json"
    if not config_file.is_file():
        return  # a weights file, or a folder that the job reports on
    problem = task_problem(config_file, hf.get("task", "sequence_classification"))
    if problem:
        raise ConfigError(f"runs.{name}.model.hf.task: {problem}.")


#: Sources without columns: their ground truth is a file of positions.
COLUMNLESS_SOURCES = ("digits", "cifar100", "imagefolder", "polarity")


def check_ground_truth_config(name: str, run: dict) -> None:
    """``data.ground_truth``: not with a corruption of the pipeline's; a column only where the data
    has columns; a positions file readable and (an .npz's) in range, an .npz's column boolean, all
    before any job (a table's column is checked when prepare_data reads it)."""
    data = run["data"]
    truth = data.get("ground_truth")
    if not truth:
        return
    key = f"runs.{name}.data.ground_truth"
    if (data.get("corruption") or {"kind": "none"})["kind"] != "none":
        raise ConfigError(
            f"{key} and data.corruption both say which samples are corrupted; keep one: ground_truth "
            "for data you corrupted yourself, corruption for the pipeline to corrupt clean data."
        )
    if "column" in truth and data["source"] in COLUMNLESS_SOURCES:
        raise ConfigError(
            f"{key}.column: {data['source']} data has no columns; give the positions in a file "
            f"({key}.indices: poisoned.npy)."
        )
    import numpy as np

    from epochlens.data.ground_truth import as_flags, read_positions_file
    from epochlens.errors import DataError

    npz = data["source"] == "npz" and os.path.isfile(data.get("path") or "")
    try:
        n_train = None
        if npz:
            with np.load(data["path"], allow_pickle=False) as archive:
                n_train = len(archive["x_train"]) if "x_train" in archive.files else None
                column = truth.get("column")
                if column is not None and column in archive.files:
                    as_flags(archive[column], column, data["path"])
        if "indices" in truth:
            read_positions_file(truth["indices"], n_train)
    except DataError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def check_npz_kind(name: str, data: dict, task: str) -> None:
    """An .npz's labels against the task, read before any job (labels only, not the inputs):
    integer labels are class ids, float labels regression targets. A missing file is left to the
    data rule's input check."""
    import numpy as np

    path = data.get("path")
    if not path or not os.path.isfile(path):
        return
    try:
        with np.load(path, allow_pickle=False) as archive:
            dtype = archive["y_train"].dtype if "y_train" in archive.files else None
    except (OSError, ValueError):
        return  # unreadable: prepare_data says so with the file's own error
    if dtype is None:
        return
    floats, regression = np.issubdtype(dtype, np.floating), task == "regression"
    if regression and not floats:
        raise ConfigError(
            f"runs.{name}: task regression, but {path} holds integer labels (y_train {dtype}), i.e. class "
            "ids. Store the targets as floats (y.astype(np.float32)), or use task: classification."
        )
    if floats and not regression:
        raise ConfigError(
            f"runs.{name}: {path} holds float targets (y_train {dtype}), but the run's task is "
            f"{task}: set runs.{name}.task: regression "
            "(and model.factory, schedule: none), or store class ids as integers (y.astype(np.int64))."
        )


def check_text_config(name: str, run: dict) -> None:
    """A text run: model.hf and text data go together; what text runs do not have (yet) is named
    with the keys to switch off, all at once."""
    text, hf = is_text_run(run), "hf" in run["model"]
    if text != hf:
        raise ConfigError(
            f"runs.{name}: model.hf (a transformer) goes with text data (data.text or data.source: "
            f"polarity) and the reverse; this run has {'text data' if text else 'model.hf'} without "
            f'{"model.hf" if text else "text data"}. README "Language models".'
        )
    if not text:
        text_transforms = [t for t in run["influence"]["transforms"] if t in TEXT_QUERY_TRANSFORMS]
        if run["influence"]["enabled"] and text_transforms:
            raise ConfigError(
                f"runs.{name}.influence.transforms: {text_transforms} transform texts; an image run's "
                f"are {['none', *IMAGE_QUERY_TRANSFORMS]}."
            )
        return
    problems = []
    if run["checkpoints"]["source"] == "train" and not run["model"]["hf"].get("config"):
        problems.append("model.hf.config: the model's config.json as a mapping (the pipeline trains it)")
    if run["train"].get("augment", "none") != "none":
        problems.append("train.augment: none (flip_crop is for images)")
    image_transforms = [t for t in run["influence"]["transforms"] if t in IMAGE_QUERY_TRANSFORMS]
    if run["influence"]["enabled"] and image_transforms:
        problems.append(
            f"influence.transforms without {image_transforms} (image transforms; a text run's are "
            f"{['none', *TEXT_QUERY_TRANSFORMS]})"
        )
    problems += causal_lm_problems(run)
    if problems:
        raise ConfigError(f"runs.{name} is a text run; set " + "; ".join(problems) + ".")


def causal_lm_problems(run: dict) -> list[str]:
    """What a causal LM or text-to-text run (or a run whose task and data disagree on being one)
    must change."""
    lm_data = bool(run["data"].get("text", {}).get("target_column"))
    if lm_data != has_token_labels(run):
        return [
            "model.hf.task: causal_lm or text_to_text together with data.text.prompt_column and "
            "target_column (the samples of a causal LM or of a text-to-text model), or neither (a "
            "sequence classifier's texts and labels)"
        ]
    if not lm_data:
        return []
    what = "text-to-text" if is_text_to_text_run(run) else "causal LM"
    problems = lm_influence_problems(run)
    trained = run["checkpoints"]["source"] == "train" and is_text_to_text_run(run)
    if run["checkpoints"]["source"] != "folder" and not trained:
        problems.append(
            f"checkpoints: {{source: folder, path: ...}} (train the {what} model yourself, e.g. with the "
            "Trainer)"
        )
    schedule = run["schedule"]
    if trained and (schedule.get("initial_classes"), schedule.get("increment")) != (1, 0):
        problems.append(
            "schedule: {initial_classes: 1, increment: 0, epochs_per_task: <epochs>} (the pipeline "
            "trains a text-to-text model on its one class, the target tokens, for that many epochs)"
        )
    if not trained and schedule.get("initial_classes", 0) is not None:
        problems.append(f"schedule: none (a {what}'s samples have no classes to introduce over time)")
    if (run["data"].get("corruption") or {"kind": "none"})["kind"] != "none":
        problems.append("data.corruption: none (label flips and triggers corrupt class labels)")
    return problems


def lm_influence_problems(run: dict) -> list[str]:
    """What a causal LM or text-to-text run's influence section must change: its loss is the target
    tokens' mean NLL (task language_model for a causal LM, text_to_text for an encoder-decoder, or
    your own task), its queries are test prompts with their targets as they are (no class
    predictions, no text transforms: they would move the targets)."""
    spec = run["influence"]
    if not spec["enabled"]:
        return []
    problems = []
    fits, other = "language_model", "text_to_text"
    if is_text_to_text_run(run):
        fits, other = other, fits
    if task_name(run) in ("classification", "regression", other):
        problems.append(
            f"task: {fits} (influence measures each sample's loss, the mean NLL of its target "
            "tokens; or your own task by import path)"
        )
    if [t for t in spec["transforms"] if t != "none"]:
        problems.append("influence.transforms: [none] (a query is a test prompt with its target as it is)")
    return problems


def check_config(config: dict) -> None:
    """:func:`check_run` for every run of a validated configuration."""
    for name, run in config["runs"].items():
        check_run(name, run)


def check_feature_config(name: str, run: dict) -> None:
    """The features, probes and ablation sections: epochs, probes without features, nothing to
    ablate, and module names the (built-in) model does not have."""
    epochs.section_epochs(name, run, "features")
    epochs.section_epochs(name, run, "ablation")
    others = [r for r in run["features"]["representations"] if r not in ("pooled", "stats", "spectral")]
    if others and not is_text_run(run) and run["features"]["enabled"]:
        raise ConfigError(
            f"runs.{name}.features.representations: {others} are for stored activations "
            "(checkpoints.source: activations); a model's features are pooled, stats and spectral."
        )
    if run["probes"]["enabled"] and not run["features"]["enabled"]:
        raise ConfigError(
            f"runs.{name}.probes.enabled: probes need the features; set runs.{name}.features."
            f"enabled: true, or runs.{name}.probes.enabled: false."
        )
    check_probe_config(name, run)
    ablation = run["ablation"]
    if ablation["channel_groups"] == 0 and not ablation["whole_blocks"]:
        raise ConfigError(
            f"runs.{name}.ablation: channel_groups: 0 with whole_blocks: false leaves nothing to "
            "ablate; set one of them."
        )
    model = run["model"].get("name")
    layers = known_layers(model) if model else None
    for section, key in (("features", "layers"), ("ablation", "blocks")):
        names = run[section][key]
        if layers is None or not run[section]["enabled"] or not names:
            continue
        unknown = [n for n in names if n not in layers]
        if unknown:
            raise ConfigError(
                f"runs.{name}.{section}.{key}: {model} has no module(s) {unknown}. Default (block "
                f"outputs, also what null gives): {DEFAULT_LAYERS[model]}; all: {layers[:60]}."
            )


def check_probe_config(name: str, run: dict) -> None:
    """probes.targets against the run's kind (class and cohort for a classifier, target and
    target_quantile for a regression), and a ridge probe's penalties with samples to choose them."""
    from epochlens.probes.settings import RIDGE_ALPHAS, probe_targets, target_problem

    spec, regression, lm = run["probes"], is_regression_run(run), has_token_labels(run)
    if not spec["enabled"]:
        return
    problem = target_problem(spec["targets"], regression, lm)
    if problem:
        lm_kind = "a text-to-text model" if is_text_to_text_run(run) else "a language model"
        kind = lm_kind if lm else "a regression (task: regression)" if regression else "a classifier"
        raise ConfigError(f"runs.{name}.probes.targets: the run is {kind}; {problem}")
    alphas = spec.get("ridge_alphas") or RIDGE_ALPHAS
    ridge = "target" in probe_targets(spec["targets"], regression) or spec.get("kind") == "ridge"
    if ridge and spec["stop_fraction"] == 0 and len(alphas) > 1:
        which = "of classes (kind: ridge)" if spec.get("kind") == "ridge" else "(target)"
        raise ConfigError(
            f"runs.{name}.probes: stop_fraction: 0 leaves the ridge probe {which} no samples to choose "
            f"its penalty among ridge_alphas {list(alphas)}; set probes.stop_fraction > 0 (e.g. 0.15) "
            "or a single penalty (probes.ridge_alphas: [0.01])."
        )
