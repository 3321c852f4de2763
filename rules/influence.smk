# Influence of training images and the data-quality study (helpers: rules/common.smk, section
# "Influence and data quality"). Per (run, index, epoch, method):
#   influence_factors  ekfac, kfac, diagonal: the curvature factors, fitted once per checkpoint and
#                      layer selection, reused by self and pairwise influence at any damping
#   influence_scores   self-influence of every training image and influence on the queries (one
#                      matrix per query transform); identity and tracin need no factors
# Per run: poison_detection (tables) -> plot_influence (figures).
# The scripts import the epochlens.influence submodules, not the package: get_code finds a
# script's modules by their files, and would miss those behind the package's __init__.py.


rule influence_factors:
    input:
        dataset=get_dataset,
        class_order=get_class_order,
        checkpoint=get_checkpoint,
        code=get_code("influence_factors.py"),
    output:
        factors="results/{run}/index-{index}/influence/epoch_{epoch}/{method}/factors.pt",
        diagnostics="results/{run}/index-{index}/influence/epoch_{epoch}/{method}/factor_diagnostics.csv",
    log:
        "results/{run}/logs/influence/index-{index}/epoch_{epoch}/{method}/factors.log",
    benchmark:
        "results/{run}/benchmarks/influence/index-{index}/epoch_{epoch}/{method}/factors.tsv"
    wildcard_constraints:
        method="ekfac|kfac|diagonal",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        config=get_influence_factor_params,
        device=config["device"],
    script:
        "../scripts/influence_factors.py"


rule influence_scores:
    input:
        dataset=get_dataset,
        class_order=get_class_order,
        checkpoint=get_checkpoint,
        factors=get_influence_factors,
        tracin_checkpoints=get_influence_tracin_checkpoints,
        code=get_code("influence_scores.py"),
    output:
        scores="results/{run}/index-{index}/influence/epoch_{epoch}/{method}/scores.npz",
        metadata="results/{run}/index-{index}/influence/epoch_{epoch}/{method}/metadata.json",
        diagnostics="results/{run}/index-{index}/influence/epoch_{epoch}/{method}/diagnostics.csv",
    log:
        "results/{run}/logs/influence/index-{index}/epoch_{epoch}/{method}/scores.log",
    benchmark:
        "results/{run}/benchmarks/influence/index-{index}/epoch_{epoch}/{method}/scores.tsv"
    wildcard_constraints:
        method="ekfac|kfac|diagonal|identity|tracin",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        config=get_influence_score_params,
        device=config["device"],
    script:
        "../scripts/influence_scores.py"


rule poison_detection:
    input:
        scores=get_run_influence_scores,
        diagnostics=get_run_influence_diagnostics,
        corrupted=get_corrupted_indices,
        dataset=get_dataset,
        code=get_code("poison_detection.py"),
    output:
        detection="results/{run}/tables/poison_detection.csv",
        agreement="results/{run}/tables/influence_transform_agreement.csv",
        roc="results/{run}/tables/poison_roc.csv",
        top="results/{run}/tables/influence_top_ranked.csv",
        conditioning="results/{run}/tables/influence_conditioning.csv",
    log:
        "results/{run}/logs/poison_detection.log",
    benchmark:
        "results/{run}/benchmarks/poison_detection.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        jobs=get_run_influence_jobs,
        study=get_poison_detection_params,
    script:
        "../scripts/poison_detection.py"


rule plot_influence:
    input:
        detection="results/{run}/tables/poison_detection.csv",
        roc="results/{run}/tables/poison_roc.csv",
        top="results/{run}/tables/influence_top_ranked.csv",
        conditioning="results/{run}/tables/influence_conditioning.csv",
        dataset=get_dataset,
        code=get_code("plot_influence.py"),
    output:
        roc_png=report(
            "results/{run}/figures/poison_roc.png",
            caption="../report/poison_roc.rst",
            category="Influence",
            subcategory="{run}",
        ),
        roc_pdf="results/{run}/figures/poison_roc.pdf",
        top_png=report(
            "results/{run}/figures/top_influential_images.png",
            caption="../report/top_influential_images.rst",
            category="Influence",
            subcategory="{run}",
        ),
        top_pdf="results/{run}/figures/top_influential_images.pdf",
        conditioning_png=report(
            "results/{run}/figures/influence_conditioning.png",
            caption="../report/influence_conditioning.rst",
            category="Influence",
            subcategory="{run}",
        ),
        conditioning_pdf="results/{run}/figures/influence_conditioning.pdf",
    log:
        "results/{run}/logs/plot_influence.log",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        corruption=get_corruption,
    script:
        "../scripts/plot_influence.py"


rule influence:
    input:
        get_all_influence(),
