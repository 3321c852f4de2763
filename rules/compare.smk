# Runs compared across their replicate indices (config comparisons): one table of every
# comparison from the runs' tables at the chosen checkpoint, and its figure.


include: "helpers/compare.smk"


rule comparison_tables:
    input:
        accuracy=comparison_inputs("accuracy"),
        regression=comparison_inputs("regression"),
        curvature=comparison_inputs("curvature"),
        dataset=comparison_inputs("dataset"),
        code=get_code("comparison_tables.py"),
    output:
        table=comparison_table("comparisons"),
        values=comparison_table("comparison_values"),
        provenance=layout.table_provenance("comparison_tables", COMPARISONS),
    log:
        layout.log("comparison_tables", COMPARISONS),
    benchmark:
        layout.benchmark("comparison_tables", COMPARISONS)
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        comparisons=get_comparison_plan(),
        sources=get_comparison_sources(),
    script:
        "../scripts/comparison_tables.py"


rule plot_comparisons:
    input:
        table=rules.comparison_tables.output.table,
        values=rules.comparison_tables.output.values,
        code=get_code("plot_comparisons.py"),
    output:
        png=report(
            layout.figure("comparisons", "png", COMPARISONS),
            caption="../report/comparisons.rst",
            category="Comparisons",
        ),
        pdf=layout.figure("comparisons", "pdf", COMPARISONS),
    log:
        layout.log("plot_comparisons", COMPARISONS),
    benchmark:
        layout.benchmark("plot_comparisons", COMPARISONS)
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_comparisons.py"


# Seconds of work on small tables: on a cluster they run on the submit host instead of queueing.
localrules:
    comparison_tables,
    plot_comparisons,
