# The sample explorer (a static page) of each run, built from the run's dossier.

#: The page's files (package data): editing one rebuilds every explorer.
EXPLORER_ASSETS = sorted(
    str(p) for p in (PACKAGE_DIR / "explorer" / "static").glob("*")
)


def explorer_targets():
    """Each dossier's explorer (rules/samples.smk: the runs that get a dossier)."""
    return [f"{layout.explorer(run)}/index.html" for run in dossier_runs()]


rule sample_explorer:
    input:
        dossier=rules.sample_dossier.output.dossier,
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
    script:
        "../scripts/sample_explorer.py"


# Seconds of work on one file: on a cluster it runs on the submit host instead of queueing.
localrules:
    sample_explorer,
