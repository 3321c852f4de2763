# Linear probes on the cached features of each checkpoint: per (layer, representation, target,
# seed) accuracy and loss on the holdout and the test split; targets are the class, old vs new
# classes, and the quantile bin of each training image's curvature where curvature is computed at
# that epoch. Then one table per run (mean and spread over seeds and indices) and its heatmaps.


rule probes_epoch:
    input:
        features="results/{run}/index-{index}/features/epoch_{epoch}.h5",
        dataset=get_dataset,
        class_order=get_class_order,
        curvature=get_probe_curvature,
        code=get_code("probes_epoch.py"),
    output:
        table="results/{run}/index-{index}/probes/epoch_{epoch}.csv",
    log:
        "results/{run}/logs/probes/index-{index}/epoch_{epoch}.log",
    benchmark:
        "results/{run}/benchmarks/probes/index-{index}/epoch_{epoch}.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        probes=get_probe_params,
        schedule=get_schedule,
    script:
        "../scripts/probes_epoch.py"


rule probe_tables:
    input:
        tables=get_run_probe_tables,
        code=get_code("probe_tables.py"),
    output:
        summary="results/{run}/tables/probes.csv",
    log:
        "results/{run}/logs/probe_tables.log",
    benchmark:
        "results/{run}/benchmarks/probe_tables.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/probe_tables.py"


rule plot_probes:
    input:
        summary="results/{run}/tables/probes.csv",
        code=get_code("plot_probes.py"),
    output:
        png=report(
            "results/{run}/figures/probe_accuracy.png",
            caption="../report/probe_accuracy.rst",
            category="Probes",
            subcategory="{run}",
        ),
        pdf="results/{run}/figures/probe_accuracy.pdf",
    log:
        "results/{run}/logs/plot_probes.log",
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_probes.py"


rule probes:
    input:
        get_all_probes(),
