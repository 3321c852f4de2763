# Per-class accuracy of every analysed checkpoint, then the run's accuracy tables.


include: "helpers/evaluate.smk"


rule evaluate_checkpoint:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        code=get_code("evaluate_checkpoint.py"),
    output:
        table=layout.eval_table(),
    log:
        layout.log("evaluate", index="{index}", epoch="{epoch}"),
    benchmark:
        layout.benchmark("evaluate", index="{index}", epoch="{epoch}")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
        runtime=get_runtime,
    params:
        run=get_eval_params,
        model=get_model_param,
    script:
        "../scripts/evaluate_checkpoint.py"


rule accuracy_tables:
    input:
        tables=get_eval_tables,
        code=get_code("accuracy_tables.py"),
    output:
        per_class=layout.table("accuracy_per_class"),
        cohorts=layout.table("accuracy_per_cohort"),
        per_group=layout.table("accuracy_per_group"),
        summary=layout.table("accuracy_summary"),
        provenance=layout.table_provenance("accuracy_tables"),
    log:
        layout.log("accuracy_tables"),
    benchmark:
        layout.benchmark("accuracy_tables")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        epochs_per_task=config_provider("schedule", "epochs_per_task"),
    script:
        "../scripts/accuracy_tables.py"


rule regression_tables:
    input:
        tables=get_eval_tables,
        code=get_code("regression_tables.py"),
    output:
        metrics=layout.table("regression_metrics"),
        summary=layout.table("regression_summary"),
        provenance=layout.table_provenance("regression_tables"),
    log:
        layout.log("regression_tables"),
    benchmark:
        layout.benchmark("regression_tables")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/regression_tables.py"


# Seconds of work on small tables: on a cluster they run on the submit host instead of queueing.
localrules:
    accuracy_tables,
    regression_tables,
