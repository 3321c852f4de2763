# One training rule per run that the pipeline trains: its outputs are that run's checkpoint files,
# whose number depends on the run's schedule (a rule's outputs cannot depend on a wildcard).
# Users who bring their own checkpoints (checkpoints.source: folder) skip training entirely; a
# checkpoint missing from their folder is the output of a missing_checkpoint job under --keep-going,
# which fails with the fix (rules/common.smk: get_checkpoint), so that the other epochs run.
# The checkpoints a training writes are write-protected: a plan that would train them again
# (changed training code, config or data; --forcerun) stops with "Write-protected output files".
# Keep them: touch them; train again on purpose: delete them (docs/guides/upgrading.md).


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
            checkpoints=protected(get_trained_checkpoints(_run)),
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


# Your own training command (checkpoints.source: command): one job per index, like train_<run>;
# its files are inputs (editing them trains again), the commit of their repository is checked
# when the run is planned and when the job starts, never a param (README "Your own training
# script").
for _run in get_command_runs():

    rule:
        name:
            f"train_{_run}"
        input:
            data=get_command_data(_run),
            files=get_command_files(_run),
            code=get_code("train_command.py"),
        output:
            checkpoints=protected(get_command_checkpoints(_run)),
            metadata=layout.train_metadata(_run),
            train_output=directory(layout.train_output(_run)),
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
            command=get_command_params(_run),
        script:
            "../scripts/train_command.py"


# The {data} of a training command: the run's prepared data set as arrays (.npz).
rule training_data:
    input:
        dataset=rules.prepare_data.output.dataset,
        code=get_code("training_data.py"),
    output:
        npz=layout.training_data(),
    log:
        layout.log("training_data"),
    benchmark:
        layout.benchmark("training_data")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/training_data.py"


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
