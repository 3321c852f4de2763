# Helpers of rules/figures.smk: input functions, params and targets.


def get_train_logs(wildcards):
    return per_index(wildcards.run, layout.train_log)


def evaluation_figure(run):
    """A run's evaluation figure: accuracy per cohort, or a regression's errors."""
    regression = run_config.is_regression_run(config["runs"][run])
    return "regression_metrics" if regression else "accuracy_by_cohort"


def figure_targets():
    """Evaluation figures of every run; training curves where the pipeline trains."""
    trained = set(get_trained_runs())
    return [
        path
        for run in config["runs"]
        if not run_config.is_stored_run(config["runs"][run])  # no model to evaluate
        for name in (evaluation_figure(run), "training_curves")
        if name != "training_curves" or run in trained
        for path in layout.figures(name, run)
    ]


def all_figures():
    """Every figure of every stage: what `snakemake figures` redraws."""
    return (
        figure_targets()
        + curvature_figures()
        + probe_figures()
        + ablation_figures()
        + influence_figures()
        + sample_figures()
        + comparison_figures()
    )


def get_accuracy_metric(wildcards):
    """What a run's accuracy is: exact match of the target tokens for a causal LM or a
    text-to-text model."""
    token_labels = run_config.has_token_labels(get_run(wildcards))
    return "exact match" if token_labels else "accuracy"
