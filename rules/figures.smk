rule plot_accuracy:
    input:
        cohorts="results/{run}/tables/accuracy_per_cohort.csv",
        code=get_code("plot_accuracy.py"),
    output:
        png=report(
            "results/{run}/figures/accuracy_by_cohort.png",
            caption="../report/accuracy_by_cohort.rst",
            category="Accuracy",
            subcategory="{run}",
        ),
        pdf="results/{run}/figures/accuracy_by_cohort.pdf",
    log:
        "results/{run}/logs/plot_accuracy.log",
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        epochs_per_task=get_epochs_per_task,
    script:
        "../scripts/plot_accuracy.py"


rule figures:
    input:
        get_all_figures(),


rule plot_training:
    input:
        logs=get_train_logs,
        code=get_code("plot_training.py"),
    output:
        png=report(
            "results/{run}/figures/training_curves.png",
            caption="../report/training_curves.rst",
            category="Training",
            subcategory="{run}",
        ),
        pdf="results/{run}/figures/training_curves.pdf",
    log:
        "results/{run}/logs/plot_training.log",
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        indices=get_indices,
        epochs_per_task=get_epochs_per_task,
    script:
        "../scripts/plot_training.py"
