# Every per-sample result of a run in one table: sample_outputs_shard (per index and shard: what
# each analysed checkpoint predicts for the shard's training and test samples, the one model pass
# of this stage; samples.shards jobs) -> sample_outputs (per index, the shards merged) -> sample_dossier
# (the run's samples/dossier.parquet, from cached results only) -> plot_data_map; sample_thumbnails
# (per run, from its data set: the images the dossier's image column names). A light CPU job
# reads the curvature arrays and influence scores the run already has: adding the dossier to a
# finished run computes the outputs and nothing else.


include: "helpers/samples.smk"


rule sample_outputs_shard:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoints=get_index_checkpoints,
        model_code=get_model_code,
        code=get_code("sample_outputs_shard.py"),
    output:
        shard=layout.sample_outputs_shard(),
    log:
        layout.log("sample_outputs", index="{index}", name=shard_name()),
    benchmark:
        layout.benchmark("sample_outputs", index="{index}", name=shard_name())
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        run=get_eval_params,
        model=get_model_param,
        epochs=get_run_epochs,
    script:
        "../scripts/sample_outputs_shard.py"


rule sample_outputs:
    input:
        shards=get_sample_output_shards,
        code=get_code("sample_outputs.py"),
    output:
        outputs=layout.sample_outputs(),
    log:
        layout.log("sample_outputs", index="{index}"),
    benchmark:
        layout.benchmark("sample_outputs", index="{index}")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    script:
        "../scripts/sample_outputs.py"


rule sample_dossier:
    input:
        dataset=rules.prepare_data.output.dataset,
        corrupted=rules.prepare_data.output.corrupted,
        outputs=get_sample_outputs,
        curvature=get_dossier_curvature,
        scores=get_dossier_influence_scores,
        influence_metadata=get_dossier_influence_metadata,
        code=get_code("sample_dossier.py"),
    output:
        dossier=layout.dossier(),
    log:
        layout.log("sample_dossier"),
    benchmark:
        layout.benchmark("sample_dossier")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    params:
        dossier=get_dossier_params,
    script:
        "../scripts/sample_dossier.py"


rule sample_thumbnails:
    input:
        dataset=rules.prepare_data.output.dataset,
        code=get_code("sample_thumbnails.py"),
    output:
        thumbnails=directory(layout.thumbnails()),
    log:
        layout.log("sample_thumbnails"),
    benchmark:
        layout.benchmark("sample_thumbnails")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    params:
        trigger=get_corruption,
    script:
        "../scripts/sample_thumbnails.py"


rule plot_data_map:
    input:
        dossier=rules.sample_dossier.output.dossier,
        code=get_code("plot_data_map.py"),
    output:
        png=layout.figure("data_map", "png"),
        pdf=layout.figure("data_map", "pdf"),
    log:
        layout.log("plot_data_map"),
    benchmark:
        layout.benchmark("plot_data_map")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_data_map.py"


# Seconds of work on cached results: on a cluster they run on the submit host instead of queueing.
localrules:
    sample_dossier,
    plot_data_map,
