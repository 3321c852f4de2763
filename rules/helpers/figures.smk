# Helpers of rules/figures.smk: input functions, params and targets.


def get_train_logs(wildcards):
    return per_index(wildcards.run, layout.train_log)


def figure_targets():
    """Accuracy figures of every run; training curves where the pipeline trains."""
    trained = set(get_trained_runs())
    return [
        path
        for run in config["runs"]
        for name in ("accuracy_by_cohort", "training_curves")
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
    )
