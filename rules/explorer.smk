# The sample explorer (a static page) of each run, built from the run's dossier.


include: "helpers/explorer.smk"


rule sample_explorer:
    input:
        dossier=rules.sample_dossier.output.dossier,
        thumbnails=get_explorer_thumbnails,
        code=get_code("sample_explorer.py"),
        assets=EXPLORER_ASSETS,
    output:
        manifest=f"{layout.explorer()}/manifest.json",
        page=f"{layout.explorer()}/index.html",
    log:
        layout.log("sample_explorer"),
    benchmark:
        layout.benchmark("sample_explorer")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    script:
        "../scripts/sample_explorer.py"


# Seconds of work on one file: on a cluster it runs on the submit host instead of queueing.
localrules:
    sample_explorer,
