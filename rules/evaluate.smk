rule evaluate_checkpoint:
    input:
        dataset=get_dataset,
        class_order=get_class_order,
        checkpoint=get_checkpoint,
        code=get_code("evaluate_checkpoint.py"),
    output:
        table="results/{run}/index-{index}/eval/epoch_{epoch}.csv",
    log:
        "results/{run}/logs/evaluate/index-{index}/epoch_{epoch}.log",
    benchmark:
        "results/{run}/benchmarks/evaluate/index-{index}/epoch_{epoch}.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        run=get_eval_run,
        device=config["device"],
    script:
        "../scripts/evaluate_checkpoint.py"


rule accuracy_tables:
    input:
        tables=get_eval_tables,
        code=get_code("accuracy_tables.py"),
    output:
        per_class="results/{run}/tables/accuracy_per_class.csv",
        cohorts="results/{run}/tables/accuracy_per_cohort.csv",
        summary="results/{run}/tables/accuracy_summary.csv",
        provenance="results/{run}/tables/accuracy_tables.provenance.json",
    log:
        "results/{run}/logs/accuracy_tables.log",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        epochs_per_task=get_epochs_per_task,
    script:
        "../scripts/accuracy_tables.py"
