# One training rule per run that the pipeline trains: its outputs are that run's checkpoint files,
# whose number depends on the run's schedule (a rule's outputs cannot depend on a wildcard).
# Users who bring their own checkpoints (checkpoints.source: folder) skip training entirely.
# Their cluster resources: get_train_resources (rules/common.smk).


for _run in get_trained_runs():

    rule:
        name:
            f"train_{_run}"
        input:
            dataset=f"results/{_run}/data/dataset.h5",
            class_order=f"results/{_run}/index-{{index}}/class_order.npy",
            code=get_code("train.py"),
        output:
            checkpoints=get_trained_checkpoints(_run),
            log_table=f"results/{_run}/index-{{index}}/train_log.csv",
            metadata=f"results/{_run}/index-{{index}}/train_metadata.json",
        log:
            f"results/{_run}/logs/train/index-{{index}}.log",
        benchmark:
            f"results/{_run}/benchmarks/train/index-{{index}}.tsv"
        conda:
            "../envs/epochlens.yaml"
        envmodules:
            *config["envmodules"],
        resources:
            **get_train_resources(),
        params:
            run=get_run_params(_run),
            device=config["device"],
        script:
            "../scripts/train.py"
