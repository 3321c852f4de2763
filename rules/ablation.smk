# Ablations at each checkpoint (ablation.epochs): every unit group (whole blocks and contiguous
# channel groups) zero- or mean-ablated in turn, with the change in accuracy and loss on the old
# and the new classes; then one table per run (mean and spread over indices) and its heatmaps.


include: "helpers/ablation.smk"


rule ablation_part:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        code=get_code("ablation_epoch.py"),
    output:
        table=ablation_part_table(),
    log:
        layout.log(
            "ablation",
            index="{index}",
            epoch="{epoch}",
            name="part_{part}-of-{nparts}",
        ),
    benchmark:
        layout.benchmark(
            "ablation",
            index="{index}",
            epoch="{epoch}",
            name="part_{part}-of-{nparts}",
        )
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        ablation=get_ablation_params,
        model=get_model_param,
        schedule=get_class_schedule,
    script:
        "../scripts/ablation_epoch.py"


# One job per checkpoint (ablation.parts: 1), or the merge of its parts' tables (no model).
rule ablation_epoch:
    input:
        dataset=in_one_part(lambda wc: layout.dataset(wc.run)),
        class_order=in_one_part(lambda wc: layout.class_order(wc.run, wc.index)),
        checkpoint=in_one_part(get_checkpoint),
        model_code=in_one_part(get_model_code),
        parts=get_ablation_parts,
        code=get_code("ablation_epoch.py"),
    output:
        table=layout.ablation_table(),
    log:
        layout.log("ablation", index="{index}", epoch="{epoch}"),
    benchmark:
        layout.benchmark("ablation", index="{index}", epoch="{epoch}")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        ablation=get_ablation_params,
        model=get_model_param,
        schedule=get_class_schedule,
    script:
        "../scripts/ablation_epoch.py"


rule ablation_tables:
    input:
        tables=get_run_ablation_tables,
        code=get_code("ablation_tables.py"),
    output:
        summary=layout.table("ablation"),
    log:
        layout.log("ablation_tables"),
    benchmark:
        layout.benchmark("ablation_tables")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/ablation_tables.py"


rule plot_ablation:
    input:
        summary=rules.ablation_tables.output.summary,
        code=get_code("plot_ablation.py"),
    output:
        png=report(
            layout.figure("ablation_effect", "png"),
            caption="../report/ablation_effect.rst",
            category="Ablations",
            subcategory="{run}",
        ),
        pdf=layout.figure("ablation_effect", "pdf"),
    log:
        layout.log("plot_ablation"),
    benchmark:
        layout.benchmark("plot_ablation")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_ablation.py"


rule ablation:
    input:
        ablation_targets(),


localrules:
    ablation,
    ablation_tables,
    plot_ablation,
