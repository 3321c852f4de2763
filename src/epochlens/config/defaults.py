"""Defaults that follow a run's source and task, filled in before the schema's own (torch-free).

The schema's defaults are the same for every run; a few keys have a better default that depends on
another key of the same run, so that a user does not have to say it twice:

* a run of stored activations (``checkpoints.source: activations``) has no model, so the stages
  that need one (curvature, ablation, influence) default to off for it; set to ``true`` they are
  still refused (:func:`epochlens.config.checks.check_stored_config`);
* a text-to-text model (``model.hf.task: text_to_text``) has the loss ``task: text_to_text``, and
  ``task: text_to_text`` of a transformer means ``model.hf.task: text_to_text``: either one says it,
  and the two saying different things is an error naming both keys;
* a run whose task has no class predictions (regression, a language model, a text-to-text model)
  takes all its test samples as influence queries (``influence.queries.select: all``), not the
  misclassified ones that only a classifier has.
"""

from __future__ import annotations

from epochlens.errors import ConfigError

#: Stages that need a model, which a run of stored activations does not have.
MODEL_STAGES = ("curvature", "ablation", "influence")

#: The built-in tasks without class predictions (a sample is not "misclassified").
UNCLASSED_TASKS = ("regression", "language_model", "text_to_text")

#: The built-in losses other than a text-to-text model's.
OTHER_LOSSES = ("classification", "regression", "language_model")


def source_defaults(config: dict) -> dict:
    """Fill, in place, every run's defaults that follow its source and task (before the schema's:
    a key the user wrote is never changed). Raises ConfigError where they contradict each other."""
    runs = config.get("runs")
    if not isinstance(runs, dict):
        return config  # the schema says what is wrong
    for name, run in runs.items():
        if isinstance(run, dict):
            _stored_defaults(run)
            _task_defaults(name, run)
            _query_defaults(run)
    return config


def _stored_defaults(run: dict) -> None:
    """A run of stored activations: the stages that need a model off unless the user says otherwise."""
    checkpoints = run.get("checkpoints")
    if not isinstance(checkpoints, dict) or checkpoints.get("source") != "activations":
        return
    for stage in MODEL_STAGES:
        section = run.setdefault(stage, {})
        if isinstance(section, dict):
            section.setdefault("enabled", False)


def _query_defaults(run: dict) -> None:
    """Influence queries of a task without class predictions: all test samples by default."""
    task = run.get("task")
    task = task.get("name") if isinstance(task, dict) else task
    influence = run.get("influence")
    if task in UNCLASSED_TASKS and isinstance(influence, dict):
        queries = influence.setdefault("queries", {})
        if isinstance(queries, dict):
            queries.setdefault("select", "all")


def _task_defaults(name: str, run: dict) -> None:
    """``task`` from ``model.hf.task`` or the reverse; one place, and a contradiction is an error."""
    model = run.get("model")
    hf = model.get("hf") if isinstance(model, dict) else None
    if not isinstance(hf, dict):
        return
    task = run.get("task")
    task = task.get("name") if isinstance(task, dict) else task
    head = hf.get("task")
    if head is None:
        if task == "text_to_text":
            hf["task"] = "text_to_text"
    elif head == "text_to_text" and task is None:
        run["task"] = "text_to_text"
    elif head == "text_to_text" and task in OTHER_LOSSES:
        raise ConfigError(
            f"runs.{name}: model.hf.task: text_to_text is trained with task: text_to_text (its target "
            f"tokens' mean NLL), but task is {task}; remove runs.{name}.task (it follows model.hf.task) "
            "or set it to text_to_text (or your own task by import path)."
        )
    elif head != "text_to_text" and task == "text_to_text":
        raise ConfigError(
            f"runs.{name}: task: text_to_text is the loss of a text-to-text model, but model.hf.task "
            f"is {head}; remove runs.{name}.model.hf.task (it follows task) or set it to text_to_text."
        )
