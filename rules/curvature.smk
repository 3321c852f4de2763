# Per-image input-loss curvature of every training image, per (index, epoch): S shard jobs, each a
# contiguous range of training samples, then one job merging them into the DESIGN.md files.
# Samples of classes not yet trained at that epoch are NaN. Params hold what changes results
# (epochlens.config.curvature_params); batch size, processes and device are read from the config
# by the shard script, so changing them reruns nothing.


include: "helpers/curvature.smk"


rule curvature_shard:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        code=get_code("curvature_shard.py"),
    output:
        shard=layout.curvature_shard(),
    log:
        layout.log("curvature", index="{index}", epoch="{epoch}", name=shard_name()),
    benchmark:
        layout.benchmark(
            "curvature", index="{index}", epoch="{epoch}", name=shard_name()
        )
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    threads: get_curvature_threads
    resources:
        **get_gpu_resources(),
    params:
        settings=get_curvature_settings,
        model=get_model_param,
        schedule=get_class_schedule,
    script:
        "../scripts/curvature_shard.py"


rule curvature_epoch:
    input:
        shards=get_curvature_shards,
        code=get_code("curvature_epoch.py"),
    output:
        **{key: layout.curvature_array(key) for key in ARRAY_DTYPES},
        metadata=layout.curvature_metadata(),
    log:
        layout.log("curvature", index="{index}", epoch="{epoch}", name="merge"),
    benchmark:
        layout.benchmark("curvature", index="{index}", epoch="{epoch}", name="merge")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    params:
        config=get_curvature_params,
    script:
        "../scripts/curvature_epoch.py"


rule curvature_tables:
    input:
        dataset=rules.prepare_data.output.dataset,
        metadata=get_run_curvature_metadata,
        arrays=get_run_curvature_arrays,
        class_orders=get_class_orders,
        code=get_code("curvature_tables.py"),
    output:
        samples=layout.table("sample_dynamics"),
        cohorts=layout.table("curvature_per_cohort"),
        distribution=layout.table("curvature_distribution"),
        summary=layout.table("curvature_summary"),
        provenance=layout.table_provenance("curvature_tables"),
    log:
        layout.log("curvature_tables"),
    benchmark:
        layout.benchmark("curvature_tables")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        indices=config_provider("indices"),
        epochs=get_run_curvature_epochs,
        schedule=get_class_schedule,
        epochs_per_task=config_provider("schedule", "epochs_per_task"),
    script:
        "../scripts/curvature_tables.py"


rule plot_curvature:
    input:
        samples=rules.curvature_tables.output.samples,
        cohorts=rules.curvature_tables.output.cohorts,
        distribution=rules.curvature_tables.output.distribution,
        code=get_code("plot_curvature.py"),
    output:
        by_cohort_png=report(
            layout.figure("curvature_by_cohort", "png"),
            caption="../report/curvature_by_cohort.rst",
            category="Curvature",
            subcategory="{run}",
        ),
        by_cohort_pdf=layout.figure("curvature_by_cohort", "pdf"),
        distribution_png=report(
            layout.figure("curvature_distribution", "png"),
            caption="../report/curvature_distribution.rst",
            category="Curvature",
            subcategory="{run}",
        ),
        distribution_pdf=layout.figure("curvature_distribution", "pdf"),
        vs_loss_png=report(
            layout.figure("curvature_vs_loss", "png"),
            caption="../report/curvature_vs_loss.rst",
            category="Curvature",
            subcategory="{run}",
        ),
        vs_loss_pdf=layout.figure("curvature_vs_loss", "pdf"),
    log:
        layout.log("plot_curvature"),
    benchmark:
        layout.benchmark("plot_curvature")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        epochs_per_task=config_provider("schedule", "epochs_per_task"),
    script:
        "../scripts/plot_curvature.py"


rule curvature:
    input:
        curvature_targets(),


localrules:
    curvature,
    curvature_tables,
    plot_curvature,
