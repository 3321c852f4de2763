# Ablations at each checkpoint (ablation.epochs): every unit group (whole blocks and contiguous
# channel groups) zero- or mean-ablated in turn, with the change in accuracy and loss on the old
# and the new classes; then one table per run (mean and spread over indices) and its heatmaps.


rule ablation_epoch:
    input:
        dataset=get_dataset,
        class_order=get_class_order,
        checkpoint=get_checkpoint,
        code=get_code("ablation_epoch.py"),
    output:
        table="results/{run}/index-{index}/ablation/epoch_{epoch}.csv",
    log:
        "results/{run}/logs/ablation/index-{index}/epoch_{epoch}.log",
    benchmark:
        "results/{run}/benchmarks/ablation/index-{index}/epoch_{epoch}.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        ablation=get_ablation_params,
        model=get_model_name,
        schedule=get_schedule,
    script:
        "../scripts/ablation_epoch.py"


rule ablation_tables:
    input:
        tables=get_run_ablation_tables,
        code=get_code("ablation_tables.py"),
    output:
        summary="results/{run}/tables/ablation.csv",
    log:
        "results/{run}/logs/ablation_tables.log",
    benchmark:
        "results/{run}/benchmarks/ablation_tables.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/ablation_tables.py"


rule plot_ablation:
    input:
        summary="results/{run}/tables/ablation.csv",
        code=get_code("plot_ablation.py"),
    output:
        png=report(
            "results/{run}/figures/ablation_effect.png",
            caption="../report/ablation_effect.rst",
            category="Ablations",
            subcategory="{run}",
        ),
        pdf="results/{run}/figures/ablation_effect.pdf",
    log:
        "results/{run}/logs/plot_ablation.log",
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_ablation.py"


rule ablation:
    input:
        get_all_ablation(),
