"""Checks of a run's influence section that the schema cannot express (torch-free): its queries against
the task, methods against the projection, a trigger to stamp, what the linear datamodeling score needs
to retrain the run. Each error names the key to fix (with :func:`epochlens.config.checks.check_run`)."""

from __future__ import annotations

from pathlib import Path

from epochlens.config import epochs
from epochlens.config.run_kinds import REGRESSION_TRANSFORMS, is_text_run, task_name
from epochlens.errors import ConfigError


def check_influence_config(name: str, run: dict) -> None:
    """The influence and data.corruption sections (epochs, TracIn epochs, trigger queries, ...)."""
    influence_epochs = epochs.influence_epochs(name, run)
    epochs.influence_indices(name, run)
    spec, name_of_task = run["influence"], task_name(run)
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
    if "trak" in spec["methods"] and spec["projection"]["precondition"] == "ekfac":
        raise ConfigError(
            f"runs.{name}.influence.projection.precondition: ekfac is logra's (each layer's Kronecker "
            "factors); trak projects the whole gradient: use gauss_newton (TRAK's (ΦᵀΦ + λI)⁻¹) or none."
        )
    if {"tracin", "tracin_rp"} & set(spec["methods"]):
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
    if unknown := unknown_words(data, str(phrase)):
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
    problems = _lds_retraining_problems(name, run, task_name, lds)
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


def _lds_retraining_problems(name: str, run: dict, task_name: str, lds: dict) -> list[str]:
    """What keeps the pipeline from retraining the run for LDS: how it was trained, and its task."""
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
    return problems


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
