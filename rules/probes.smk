# Linear probes on the cached features of each checkpoint: per (layer, representation, target,
# seed) accuracy and loss on the holdout and the test split; targets are the class, old vs new
# classes, and the quantile bin of each training image's curvature where curvature is computed at
# that epoch. Then one table per run (mean and spread over seeds and indices) and its heatmaps.


include: "helpers/probes.smk"


rule probes_epoch:
    input:
        features=rules.features_epoch.output.features,
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        curvature=get_probe_curvature,
        code=get_code("probes_epoch.py"),
    output:
        table=layout.probe_table(),
    log:
        layout.log("probes", index="{index}", epoch="{epoch}"),
    benchmark:
        layout.benchmark("probes", index="{index}", epoch="{epoch}")
    wildcard_constraints:
        run=runs_pattern(stored=False),
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    params:
        probes=get_probe_params,
        schedule=config_provider("schedule"),
    script:
        "../scripts/probes_epoch.py"


# A run of stored activations: the probes of one representation of one snapshot, on its own
# features file (rules/features.smk), so editing one representation reruns its probes only; the
# same script and table format as probes_epoch.
rule probes_stored:
    input:
        features=rules.features_stored.output.features,
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        curvature=get_probe_curvature,
        code=get_code("probes_epoch.py"),
    output:
        table=layout.stored_probe_table(),
    log:
        layout.log("probes", index="{index}", epoch="{epoch}", name="{representation}"),
    benchmark:
        layout.benchmark(
            "probes", index="{index}", epoch="{epoch}", name="{representation}"
        )
    wildcard_constraints:
        run=runs_pattern(stored=True),
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        probes=get_probe_params,
        schedule=config_provider("schedule"),
    script:
        "../scripts/probes_epoch.py"


rule probe_tables:
    input:
        tables=get_run_probe_tables,
        code=get_code("probe_tables.py"),
    output:
        summary=layout.table("probes"),
    log:
        layout.log("probe_tables"),
    benchmark:
        layout.benchmark("probe_tables")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/probe_tables.py"


rule plot_probes:
    input:
        summary=rules.probe_tables.output.summary,
        code=get_code("plot_probes.py"),
    output:
        png=report(
            layout.figure("probe_accuracy", "png"),
            caption="../report/probe_accuracy.rst",
            category="Probes",
            subcategory="{run}",
        ),
        pdf=layout.figure("probe_accuracy", "pdf"),
    log:
        layout.log("plot_probes"),
    benchmark:
        layout.benchmark("plot_probes")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_probes.py"


rule probes:
    input:
        probe_targets(),


localrules:
    probes,
    probe_tables,
    plot_probes,
