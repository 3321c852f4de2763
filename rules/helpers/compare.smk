# Helpers of rules/compare.smk: the comparisons' plan, inputs and targets.

# results/comparisons/: the tables and figures that compare runs (no run's folder).
COMPARISONS = run_config.COMPARISONS_DIR


def get_comparison_plan():
    """Every comparison with each run's checkpoint, indices and tables (the table job's params;
    epochlens.config.comparison_plan). Its errors name the config key to fix."""
    try:
        return run_config.comparison_plan(config)
    except EpochlensError as exc:
        raise WorkflowError(str(exc)) from None


def get_comparison_sources():
    """The runs whose tables the comparisons read, per table (accuracy, regression, curvature,
    dataset): the order of the table job's input lists."""
    return run_config.comparison_sources(config)


# The run-level table each source of get_comparison_sources is (dataset: the run's data set).
COMPARISON_TABLES = {
    "accuracy": "accuracy_per_class",
    "regression": "regression_metrics",
    "curvature": "curvature_per_cohort",
}


def comparison_inputs(source):
    """The ``source`` files of the runs compared (get_comparison_sources' order)."""
    runs = get_comparison_sources()[source]
    if source == "dataset":
        return [layout.dataset(run) for run in runs]
    return [layout.table(COMPARISON_TABLES[source], run) for run in runs]


def comparison_table(name):
    return layout.table(name, COMPARISONS)


def comparison_targets():
    """The comparison tables and figure, when the config compares runs."""
    if not config.get("comparisons"):
        return []
    return [
        comparison_table("comparisons"),
        comparison_table("comparison_values"),
    ] + comparison_figures()


def comparison_figures():
    if not config.get("comparisons"):
        return []
    return layout.figures("comparisons", COMPARISONS)
