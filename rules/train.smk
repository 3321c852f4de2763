# One training rule per run that the pipeline trains: its outputs are that run's checkpoint files,
# whose number depends on the run's schedule (a rule's outputs cannot depend on a wildcard).
# Users who bring their own checkpoints (checkpoints.source: folder) skip training entirely; a
# checkpoint missing from their folder is the output of a missing_checkpoint job under --keep-going,
# which fails with the fix (rules/common.smk: get_checkpoint), so that the other epochs run.


include: "helpers/train.smk"


for _run in get_trained_runs():

    rule:
        name:
            f"train_{_run}"
        input:
            dataset=layout.dataset(_run),
            class_order=layout.class_order(_run),
            code=get_code("train.py"),
        output:
            checkpoints=get_trained_checkpoints(_run),
            log_table=layout.train_log(_run),
            metadata=layout.train_metadata(_run),
        log:
            layout.log("train", _run, index="{index}"),
        benchmark:
            layout.benchmark("train", _run, index="{index}")
        conda:
            "../envs/epochlens.yaml"
        envmodules:
            *config["envmodules"],
        resources:
            **get_train_resources(),
        params:
            run=run_config.run_params(config["runs"][_run]),
        script:
            "../scripts/train.py"


rule missing_checkpoint:
    output:
        layout.missing_checkpoint(),
    log:
        layout.log("missing_checkpoint", index="{index}", epoch="{epoch}"),
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        error=get_missing_checkpoint_error,
    script:
        "../scripts/missing_checkpoint.py"


localrules:
    missing_checkpoint,
