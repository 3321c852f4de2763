"""A run's configuration, interpreted without Snakemake and without torch.

* :mod:`.schema`   schema validation with the schema's defaults filled in, errors by key;
* :mod:`.epochs`   which checkpoints a run has and which of them each stage analyses;
* :mod:`.inputs`   where a run's checkpoints are, and every missing one in one message;
* :mod:`.defaults` defaults that follow a run's source and task (filled before the schema's);
* :mod:`.stored_checks` the checks of a run of stored activations;
* :mod:`.checks`   cross-field checks that a schema cannot express (before any job runs);
* :mod:`.results`  which settings change a stage's results (the rules' params), derived from the
  stages' settings dataclasses;
* :mod:`.comparisons`  the comparisons of runs: checks, and what the comparison job reads.

The workflow (``rules/common.smk``) calls :func:`validate` once and reads the rest per rule.
"""

from __future__ import annotations

from pathlib import Path

from epochlens.config.checks import check_config, check_run
from epochlens.config.comparisons import (
    COMPARISONS_DIR,
    check_comparisons,
    comparison_plan,
    comparison_sources,
)
from epochlens.config.defaults import source_defaults
from epochlens.config.epochs import (
    analysis_epochs,
    checkpoint_epochs,
    curvature_epochs,
    influence_epochs,
    influence_indices,
    lds_start_epoch,
    num_classes,
    probe_epochs,
    schedule,
    section_epochs,
    tracin_epochs,
)
from epochlens.config.inputs import (
    MISSING_RULE,
    MissingCheckpoint,
    checkpoint_path,
    missing_checkpoint_error,
    missing_checkpoints,
    missing_checkpoints_message,
    needs_file,
)
from epochlens.config.results import (
    ANALYSIS_SECTIONS,
    ablation_params,
    class_schedule,
    corruption,
    curvature_params,
    feature_params,
    influence_curvature_params,
    influence_factor_params,
    influence_score_params,
    lds_retrain_params,
    lds_table_params,
    model_param,
    poison_detection_params,
    probe_params,
    result_settings,
    run_params,
    stored_code,
    stored_feature_params,
    stored_representations,
)
from epochlens.config.run_kinds import (
    has_token_labels,
    is_causal_lm_run,
    is_regression_run,
    is_stored_run,
    task_name,
)
from epochlens.config.schema import explain_config_errors, fill_defaults
from epochlens.schedule import NO_SCHEDULE


def validate(config: dict, schema_path: str | Path) -> dict:
    """Check ``config`` against the schema (filling its defaults in place), then every run's
    cross-field checks and the comparisons'. The defaults that follow a run's source and task
    (:mod:`.defaults`) are filled first. Raises :class:`~epochlens.errors.ConfigError` naming
    the keys to fix."""
    source_defaults(config)
    fill_defaults(config, schema_path)
    for run in config.get("runs", {}).values():
        if run.get("schedule") == "none":
            run["schedule"] = dict(NO_SCHEDULE)
        if run.get("checkpoints", {}).get("source") == "activations":
            run.setdefault("model", {})  # stored activations: no model
    check_config(config)
    check_comparisons(config)
    return config


__all__ = [
    "ANALYSIS_SECTIONS",
    "COMPARISONS_DIR",
    "MISSING_RULE",
    "MissingCheckpoint",
    "ablation_params",
    "analysis_epochs",
    "check_comparisons",
    "check_config",
    "check_run",
    "class_schedule",
    "comparison_plan",
    "comparison_sources",
    "checkpoint_epochs",
    "checkpoint_path",
    "corruption",
    "curvature_epochs",
    "curvature_params",
    "explain_config_errors",
    "feature_params",
    "fill_defaults",
    "has_token_labels",
    "influence_epochs",
    "influence_indices",
    "is_causal_lm_run",
    "is_regression_run",
    "is_stored_run",
    "lds_start_epoch",
    "influence_factor_params",
    "model_param",
    "influence_curvature_params",
    "influence_score_params",
    "lds_retrain_params",
    "lds_table_params",
    "missing_checkpoint_error",
    "missing_checkpoints",
    "missing_checkpoints_message",
    "needs_file",
    "num_classes",
    "poison_detection_params",
    "probe_epochs",
    "probe_params",
    "result_settings",
    "run_params",
    "schedule",
    "section_epochs",
    "stored_code",
    "stored_feature_params",
    "stored_representations",
    "task_name",
    "tracin_epochs",
    "validate",
]
