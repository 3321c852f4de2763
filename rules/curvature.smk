# Per-image input-loss curvature of every training image, per (index, epoch): S shard jobs, each a
# contiguous range of training samples, then one job merging them into the DESIGN.md files.
# Samples of classes not yet trained at that epoch are NaN.


rule curvature_shard:
    input:
        dataset=get_dataset,
        class_order=get_class_order,
        checkpoint=get_checkpoint,
        code=get_code("curvature_shard.py"),
    output:
        shard="results/{run}/index-{index}/curvature/epoch_{epoch}/shards/shard_{shard}-of-{nshards}.npz",
    log:
        "results/{run}/logs/curvature/index-{index}/epoch_{epoch}/shard_{shard}-of-{nshards}.log",
    benchmark:
        "results/{run}/benchmarks/curvature/index-{index}/epoch_{epoch}/shard_{shard}-of-{nshards}.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    threads: get_curvature_threads
    params:
        settings=get_curvature_settings,
        model=get_curvature_model,
        schedule=get_schedule,
        device=config["device"],
    script:
        "../scripts/curvature_shard.py"


rule curvature_epoch:
    input:
        shards=get_curvature_shards,
        code=get_code("curvature_epoch.py"),
    output:
        curvature="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_curvature.npy",
        directional_eig="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_directional_eig.npy",
        loss="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_loss.npy",
        grad_norm="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_grad_norm.npy",
        correct="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_correct.npy",
        labels="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_labels.npy",
        holdout="results/{run}/index-{index}/curvature/epoch_{epoch}/per_image_holdout.npy",
        metadata="results/{run}/index-{index}/curvature/epoch_{epoch}/metadata.json",
    log:
        "results/{run}/logs/curvature/index-{index}/epoch_{epoch}/merge.log",
    benchmark:
        "results/{run}/benchmarks/curvature/index-{index}/epoch_{epoch}/merge.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        config=get_curvature_params,
    script:
        "../scripts/curvature_epoch.py"


rule curvature_tables:
    input:
        metadata=get_run_curvature_metadata,
        arrays=get_run_curvature_arrays,
        class_orders=get_class_orders,
        code=get_code("curvature_tables.py"),
    output:
        samples="results/{run}/tables/sample_dynamics.csv",
        cohorts="results/{run}/tables/curvature_per_cohort.csv",
        distribution="results/{run}/tables/curvature_distribution.csv",
        summary="results/{run}/tables/curvature_summary.csv",
        provenance="results/{run}/tables/curvature_tables.provenance.json",
    log:
        "results/{run}/logs/curvature_tables.log",
    benchmark:
        "results/{run}/benchmarks/curvature_tables.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        indices=get_indices,
        epochs=get_run_curvature_epochs,
        schedule=get_schedule,
        epochs_per_task=get_epochs_per_task,
    script:
        "../scripts/curvature_tables.py"


rule plot_curvature:
    input:
        samples="results/{run}/tables/sample_dynamics.csv",
        cohorts="results/{run}/tables/curvature_per_cohort.csv",
        distribution="results/{run}/tables/curvature_distribution.csv",
        code=get_code("plot_curvature.py"),
    output:
        by_cohort_png=report(
            "results/{run}/figures/curvature_by_cohort.png",
            caption="../report/curvature_by_cohort.rst",
            category="Curvature",
            subcategory="{run}",
        ),
        by_cohort_pdf="results/{run}/figures/curvature_by_cohort.pdf",
        distribution_png=report(
            "results/{run}/figures/curvature_distribution.png",
            caption="../report/curvature_distribution.rst",
            category="Curvature",
            subcategory="{run}",
        ),
        distribution_pdf="results/{run}/figures/curvature_distribution.pdf",
        vs_loss_png=report(
            "results/{run}/figures/curvature_vs_loss.png",
            caption="../report/curvature_vs_loss.rst",
            category="Curvature",
            subcategory="{run}",
        ),
        vs_loss_pdf="results/{run}/figures/curvature_vs_loss.pdf",
    log:
        "results/{run}/logs/plot_curvature.log",
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    params:
        epochs_per_task=get_epochs_per_task,
    script:
        "../scripts/plot_curvature.py"


rule curvature:
    input:
        get_all_curvature(),
