# Accuracy and training figures, and the target that redraws every figure of every stage.


include: "helpers/figures.smk"


rule plot_accuracy:
    input:
        cohorts=rules.accuracy_tables.output.cohorts,
        per_group=rules.accuracy_tables.output.per_group,
        code=get_code("plot_accuracy.py"),
    output:
        png=report(
            layout.figure("accuracy_by_cohort", "png"),
            caption="../report/accuracy_by_cohort.rst",
            category="Accuracy",
            subcategory="{run}",
        ),
        pdf=layout.figure("accuracy_by_cohort", "pdf"),
    log:
        layout.log("plot_accuracy"),
    benchmark:
        layout.benchmark("plot_accuracy")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        epochs_per_task=config_provider("schedule", "epochs_per_task"),
        metric=get_accuracy_metric,
    script:
        "../scripts/plot_accuracy.py"


rule plot_regression:
    input:
        metrics=rules.regression_tables.output.metrics,
        code=get_code("plot_regression.py"),
    output:
        png=report(
            layout.figure("regression_metrics", "png"),
            caption="../report/regression_metrics.rst",
            category="Accuracy",
            subcategory="{run}",
        ),
        pdf=layout.figure("regression_metrics", "pdf"),
    log:
        layout.log("plot_regression"),
    benchmark:
        layout.benchmark("plot_regression")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_regression.py"


rule figures:
    input:
        all_figures(),


rule plot_training:
    input:
        logs=get_train_logs,
        code=get_code("plot_training.py"),
    output:
        png=report(
            layout.figure("training_curves", "png"),
            caption="../report/training_curves.rst",
            category="Training",
            subcategory="{run}",
        ),
        pdf=layout.figure("training_curves", "pdf"),
    log:
        layout.log("plot_training"),
    benchmark:
        layout.benchmark("plot_training")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        indices=config_provider("indices"),
        epochs_per_task=config_provider("schedule", "epochs_per_task"),
    script:
        "../scripts/plot_training.py"


localrules:
    figures,
    plot_accuracy,
    plot_regression,
    plot_training,
