"""What kind of run a run's configuration describes (torch-free): stored activations or a model,
text or images, a causal LM or text-to-text model (prompts and targets), a classifier or a
regression, and what a regression may read, transform and corrupt. The checks of
:mod:`epochlens.config.checks` and the workflow's rules ask these.
"""

from __future__ import annotations


def is_stored_run(run: dict) -> bool:
    """Whether the run's features come from stored activations (no model, no checkpoints)."""
    return run["checkpoints"]["source"] == "activations"


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
