"""Checks of a run's configuration that the schema cannot express (torch-free).

They run while the workflow is planned, before any job: each error names the config key to fix.
Layer names of the built-in models are checked against :mod:`epochlens.models.catalog`; other
models are checked when their job builds them.
"""

from __future__ import annotations

import os
from pathlib import Path

from epochlens.config import epochs
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


def is_stored_run(run: dict) -> bool:
    """Whether the run's features come from stored activations (no model, no checkpoints)."""
    return run["checkpoints"]["source"] == "activations"


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


def is_text_run(run: dict) -> bool:
    """A run of tokenised text (data.text, or the polarity source) and a transformer (model.hf)."""
    return "text" in run["data"] or run["data"]["source"] == "polarity"


def is_causal_lm_run(run: dict) -> bool:
    """A text run of a causal language model (``model.hf.task: causal_lm``): prompts and targets,
    no classes (its jobs get no class schedule)."""
    return is_text_run(run) and run["model"].get("hf", {}).get("task") == "causal_lm"


def is_text_to_text_run(run: dict) -> bool:
    """A text run of an encoder-decoder model (``model.hf.task: text_to_text``): prompts are the
    encoder's inputs, targets the decoder's labels; no classes, like a causal LM."""
    return is_text_run(run) and run["model"].get("hf", {}).get("task") == "text_to_text"


def has_token_labels(run: dict) -> bool:
    """A run whose samples are prompts and targets (a causal LM or a text-to-text model): its loss
    is the target tokens' mean NLL, its accuracy exact match, and it has no class schedule."""
    return is_causal_lm_run(run) or is_text_to_text_run(run)


def task_name(run: dict) -> str:
    """The run's ``task`` by name: classification, regression, language_model or an import path."""
    task = run.get("task", "classification")
    return task if isinstance(task, str) else task["name"]


def is_regression_run(run: dict) -> bool:
    """A run of continuous targets (``task: regression``): no classes (its jobs get no class
    schedule), per-sample loss the squared error, MSE / MAE / R² in place of accuracy."""
    return task_name(run) == "regression"


#: Data sources whose targets can be continuous (regression).
REGRESSION_SOURCES = ("npz", "csv", "jsonl", "parquet", "save_to_disk")
#: The query transforms that apply to any input (a regression's).
REGRESSION_TRANSFORMS = ("none", "noise")
#: What a regression run may corrupt.
REGRESSION_CORRUPTIONS = ("none", "target_noise")


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


def check_influence_config(name: str, run: dict) -> None:
    """The influence and data.corruption sections: epochs, TracIn epochs, trigger queries without
    a trigger, a trigger's target class outside the data set."""
    influence_epochs = epochs.influence_epochs(name, run)
    epochs.influence_indices(name, run)
    spec = run["influence"]
    name_of_task = task_name(run)
    if spec["enabled"] and name_of_task in ("regression", "language_model", "text_to_text"):
        queries = spec["queries"]
        if queries["select"] == "misclassified" or queries["labels"] == "predicted":
            selects = "all or highest_loss" if name_of_task == "regression" else "all"
            raise ConfigError(
                f"runs.{name}.influence.queries: select: misclassified and labels: predicted need "
                f"class predictions, which task {name_of_task} has none of; set queries.select: "
                f"{selects} and queries.labels: correct."
            )
    if spec["enabled"] and spec["queries"]["select"] == "highest_loss" and name_of_task != "regression":
        raise ConfigError(
            f"runs.{name}.influence.queries.select: highest_loss is a regression's; a classifier's "
            "queries are misclassified or all."
        )
    odd = [t for t in spec["transforms"] if t not in REGRESSION_TRANSFORMS]
    if spec["enabled"] and name_of_task == "regression" and odd:
        raise ConfigError(
            f"runs.{name}.influence.transforms: {odd} transform images or texts; a regression's "
            f"queries take {list(REGRESSION_TRANSFORMS)} (noise: Gaussian noise on the inputs)."
        )
    if "tracin" in spec["methods"]:
        for epoch in influence_epochs:
            epochs.tracin_epochs(name, run, epoch)
    corruption = run["data"].get("corruption") or {"kind": "none"}
    if spec["queries"]["trigger"] and corruption["kind"] != "trigger":
        raise ConfigError(
            f"runs.{name}.influence.queries.trigger: true needs a trigger to stamp; set "
            f"runs.{name}.data.corruption.kind: trigger, or queries.trigger: null."
        )
    check_lds_config(name, run, name_of_task, corruption)
    if corruption["kind"] == "trigger":
        check_trigger_config(name, run, corruption)


def check_trigger_config(name: str, run: dict, corruption: dict) -> None:
    """A trigger: its target class among the data set's classes (where known before the data is
    read), a text run's phrase given and known to its tokenizer, no phrase for an image run."""
    key = f"runs.{name}.data.corruption"
    text = is_text_run(run)
    data = run["data"]
    if not text or data["source"] in epochs.KNOWN_NUM_CLASSES or data.get("num_classes"):
        classes = epochs.num_classes(data)  # else: checked when prepare_data reads the labels
        if corruption["target_class"] >= classes:
            raise ConfigError(
                f"{key}.target_class: {corruption['target_class']} is not a class of this data set "
                f"(0..{classes - 1})."
            )
    phrase = corruption.get("phrase")
    if not text:
        if phrase is not None:
            raise ConfigError(
                f"{key}.phrase: an image run's trigger is a patch (patch_size, corner); a phrase is a "
                "text run's. Remove phrase."
            )
        return
    if phrase is None or not str(phrase).strip():
        raise ConfigError(
            f"{key}.phrase: a text run's trigger is a phrase put into the poisoned sentences; set it "
            '(e.g. "cf"'
            + (", one of the polarity vocabulary's trigger words" if data["source"] == "polarity" else "")
            + ")."
        )
    unknown = unknown_words(data, str(phrase))
    if unknown:
        raise ConfigError(
            f"{key}.phrase: {phrase!r} has words the run's tokenizer cannot encode ({unknown}: its "
            "unknown token); use words of its vocabulary"
            + (f", e.g. one of {list(_polarity().TRIGGER_WORDS)}" if data["source"] == "polarity" else "")
            + "."
        )


def _polarity():
    from epochlens.data import polarity

    return polarity


def unknown_words(data: dict, phrase: str) -> list[str]:
    """Words of ``phrase`` that the run's tokenizer encodes as its unknown token: the polarity
    vocabulary's, or a tokenizer folder's ``tokenizer.json`` (read by the ``tokenizers`` library;
    a folder without one is checked when prepare_data loads it)."""
    if data["source"] == "polarity":
        vocabulary = set(_polarity().vocabulary())
        return [w for w in phrase.split() if w not in vocabulary]
    path = Path(str(data.get("text", {}).get("tokenizer") or "")) / "tokenizer.json"
    if not path.is_file():
        return []
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    unk = getattr(tokenizer.model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if unk else None
    if unk_id is None:
        return []
    return [w for w in phrase.split() if unk_id in tokenizer.encode(w, add_special_tokens=False).ids]


def check_lds_config(name: str, run: dict, task_name: str, corruption: dict) -> None:
    """influence.lds retrains the run: the pipeline must know its recipe (a built-in network, or a
    text classifier built from its config), or run its training command on each subset (a command
    with {subset} and {data}); the queries must be test samples it can measure as they are."""
    spec = run["influence"]
    lds = spec["lds"]
    if not (spec["enabled"] and lds["enabled"]):
        return
    key = f"runs.{name}.influence.lds"
    problems = []
    source = run["checkpoints"]["source"]
    if source == "command":
        problems += _lds_command_problems(name, run, task_name, lds)
    elif source != "train" or not ({"name", "hf"} & set(run["model"])):
        problems.append(
            "it retrains the run with the pipeline's recipe, so the run must be trained by the "
            "pipeline (checkpoints.source: train, a built-in model.name or a model.hf.config), or by "
            "your training command given each subset (checkpoints.source: command with {subset} and "
            '{data}; README "Your own training script")'
        )
    if source == "train" and task_name == "regression":
        problems.append(
            "the pipeline trains classifiers only; a regression's LDS retrains with your training "
            "command (checkpoints.source: command with {subset} and {data})"
        )
    elif task_name == "text_to_text" and source == "command":
        problems.append(
            "a text-to-text run's LDS retrains with the pipeline's recipe, not a training command: "
            "train it by the pipeline (checkpoints.source: train, model.hf.config)"
        )
    elif task_name not in ("classification", "regression", "text_to_text"):
        problems.append(
            f"it measures classification, regression or text-to-text losses; task {task_name} is not "
            "supported yet"
        )
    if "none" not in spec["transforms"]:
        problems.append("it correlates the untransformed queries' scores; add none to influence.transforms")
    trigger = spec["queries"]["trigger"]
    if trigger or (trigger is None and corruption["kind"] == "trigger"):
        problems.append("it measures clean test images; set influence.queries.trigger: false")
    if lds["parts"] > lds["subsets"]:
        problems.append(f"parts ({lds['parts']}) must not exceed subsets ({lds['subsets']})")
    if lds.get("start") == "previous" and not problems:
        first = [e for e in epochs.influence_epochs(name, run) if epochs.lds_start_epoch(run, e) is None]
        if first:
            problems.append(
                f"start: previous needs a checkpoint before each influence epoch; epoch(s) {first} "
                "have none (use start: scratch, or later influence.epochs)"
            )
    if problems:
        raise ConfigError(f"{key}: " + "; ".join(problems) + f". Or set {key}.enabled: false.")


def _lds_command_problems(name: str, run: dict, task_name: str, lds: dict) -> list[str]:
    """What keeps a run's training command from retraining it for LDS: the subset contract."""
    from epochlens.formats.command import CommandSpec

    command = CommandSpec.from_config(name, run)
    missing = [p for p in ("subset", "data") if p not in command.placeholders]
    problems = []
    if missing:
        braces = " and ".join("{" + p + "}" for p in missing)
        problems.append(
            f"it retrains the run by running runs.{name}.checkpoints.command once per random subset of "
            f"the training samples, so the command must accept a training-subset file, but it has no "
            f"{braces}. Add {{subset}} (an .npy of int64 positions in {{data}}'s x_train to train on: "
            "every non-holdout position for the run's own training, each subset for LDS) and {data} "
            '(the data set the positions index) to the command; README "Your own training script"'
        )
    if lds.get("start") == "previous":
        problems.append(
            "start: previous warm-starts the pipeline's own recipe; a training command retrains from "
            "scratch (start: scratch)"
        )
    return problems
