# Influence of training images and the data-quality study. Per (run, index, epoch, method):
#   influence_factors  ekfac, kfac, diagonal: the curvature factors, fitted once per checkpoint and
#                      layer selection, reused by self and pairwise influence at any damping
#   influence_scores   self-influence of every training image and influence on the queries (one
#                      matrix per query transform); identity and tracin need no factors
# With influence.shards S > 1 every pass over the training images is S jobs, each a contiguous range
# of them: influence_covariances (ekfac, kfac) -> influence_eigenbasis (ekfac: summed and
# eigendecomposed; kfac's factors are that) -> influence_corrections (ekfac, diagonal) ->
# influence_factors (summed); influence_score_shard -> influence_scores (concatenated). A killed
# shard reruns alone. With S = 1 influence_factors and influence_scores do the passes themselves.
# The projected methods (logra by layer, trak the whole gradient) write each training image's projected
# gradient once per checkpoint (influence_store_shard, S jobs: the gradient store), eigendecompose its
# projected curvature once (influence_store_eigen) and score any queries with one read of it
# (influence_store_scores: the same scores.npz as influence_scores). tracin_rp: a store at each of
# its tracin_epochs, no curvature; its influence_store_scores sums over them.
# Per run: poison_detection (tables) -> plot_influence (figures); with influence.lds the linear
# datamodeling score: lds_retrain (index x epoch x part) -> lds_tables -> plot_lds. A run whose
# training is its own command is retrained by that command (its {subset}): its files and {data}
# are the lds_retrain jobs' inputs, pinned as its training jobs are (rules/helpers/train.smk).
# prepare_data applies data.corruption and records the corrupted positions (rules/data.smk). Params
# hold what changes results (epochlens.config.influence_*_params); batch sizes and device are read
# from the config by the scripts, so changing them reruns nothing.


include: "helpers/influence.smk"


rule influence_covariances:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        code=get_code("influence_factor_shard.py"),
    output:
        shard=layout.influence_shard("covariances"),
    log:
        layout.log(
            "influence",
            index="{index}",
            epoch="{epoch}",
            name=shard_log("covariances"),
        ),
    benchmark:
        layout.benchmark(
            "influence",
            index="{index}",
            epoch="{epoch}",
            name=shard_log("covariances"),
        )
    wildcard_constraints:
        method="ekfac|kfac",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_factor_params,
        kind="covariances",
    script:
        "../scripts/influence_factor_shard.py"


rule influence_eigenbasis:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        covariances=get_influence_covariance_shards,
        code=get_code("influence_factors.py"),
    output:
        eigenbasis=layout.influence_file("eigenbasis.pt"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name="{method}/eigenbasis"
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name="{method}/eigenbasis"
        )
    wildcard_constraints:
        method="ekfac",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_factor_params,
    script:
        "../scripts/influence_factors.py"


rule influence_corrections:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        eigenbasis=get_influence_eigenbasis,
        code=get_code("influence_factor_shard.py"),
    output:
        shard=layout.influence_shard("corrections"),
    log:
        layout.log(
            "influence",
            index="{index}",
            epoch="{epoch}",
            name=shard_log("corrections"),
        ),
    benchmark:
        layout.benchmark(
            "influence",
            index="{index}",
            epoch="{epoch}",
            name=shard_log("corrections"),
        )
    wildcard_constraints:
        method="ekfac|diagonal",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_factor_params,
        kind="corrections",
    script:
        "../scripts/influence_factor_shard.py"


rule influence_factors:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        covariances=get_influence_factor_covariances,
        eigenbasis=get_influence_eigenbasis,
        corrections=get_influence_correction_shards,
        code=get_code("influence_factors.py"),
    output:
        factors=layout.influence_file("factors.pt"),
        diagnostics=layout.influence_file("factor_diagnostics.csv"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name="{method}/factors"
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name="{method}/factors"
        )
    wildcard_constraints:
        method="ekfac|kfac|diagonal",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_factor_params,
    script:
        "../scripts/influence_factors.py"


rule influence_score_shard:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        factors=get_influence_factors,
        tracin_checkpoints=get_influence_tracin_checkpoints,
        code=get_code("influence_score_shard.py"),
    output:
        shard=layout.influence_shard("scores"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name=shard_log("scores")
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name=shard_log("scores")
        )
    wildcard_constraints:
        method="ekfac|kfac|diagonal|identity|tracin",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_score_params,
    script:
        "../scripts/influence_score_shard.py"


rule influence_scores:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        factors=get_influence_factors,
        tracin_checkpoints=get_influence_tracin_checkpoints,
        shards=get_influence_score_shards,
        code=get_code("influence_scores.py"),
    output:
        scores=layout.influence_file("scores.npz"),
        metadata=layout.influence_file("metadata.json"),
        diagnostics=layout.influence_file("diagnostics.csv"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name="{method}/scores"
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name="{method}/scores"
        )
    wildcard_constraints:
        method="ekfac|kfac|diagonal|identity|tracin",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_score_params,
    script:
        "../scripts/influence_scores.py"


rule influence_store_shard:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        code=get_code("influence_store_shard.py"),
    output:
        gradients=layout.influence_shard("store", ext="npy"),
        info=layout.influence_shard("store"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name=shard_log("store")
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name=shard_log("store")
        )
    wildcard_constraints:
        method=STORE,
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_factor_params,
    script:
        "../scripts/influence_store_shard.py"


rule influence_store_eigen:
    input:
        infos=get_influence_store_infos,
        code=get_code("influence_store_eigen.py"),
    output:
        curvature=layout.influence_file("curvature.pt"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name="{method}/curvature"
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name="{method}/curvature"
        )
    wildcard_constraints:
        method=PROJECTED,
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
        runtime=get_runtime,
    params:
        config=get_influence_curvature_params,
    script:
        "../scripts/influence_store_eigen.py"


rule influence_store_scores:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        gradients=get_influence_store_gradients,
        infos=get_influence_store_infos,
        curvature=get_influence_store_curvature,
        tracin_checkpoints=get_influence_tracin_checkpoints,
        code=get_code("influence_store_scores.py"),
    output:
        scores=layout.influence_file("scores.npz"),
        metadata=layout.influence_file("metadata.json"),
        diagnostics=layout.influence_file("diagnostics.csv"),
    log:
        layout.log(
            "influence", index="{index}", epoch="{epoch}", name="{method}/scores"
        ),
    benchmark:
        layout.benchmark(
            "influence", index="{index}", epoch="{epoch}", name="{method}/scores"
        )
    wildcard_constraints:
        method=STORE,
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        config=get_influence_score_params,
    script:
        "../scripts/influence_store_scores.py"


rule poison_detection:
    input:
        scores=get_run_influence_scores,
        diagnostics=get_run_influence_diagnostics,
        corrupted=rules.prepare_data.output.corrupted,
        dataset=rules.prepare_data.output.dataset,
        code=get_code("poison_detection.py"),
    output:
        detection=layout.table("poison_detection"),
        agreement=layout.table("influence_transform_agreement"),
        roc=layout.table("poison_roc"),
        top=layout.table("influence_top_ranked"),
        conditioning=layout.table("influence_conditioning"),
    log:
        layout.log("poison_detection"),
    benchmark:
        layout.benchmark("poison_detection")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_mem_mb,
    params:
        jobs=get_run_influence_jobs,
        study=get_poison_detection_params,
    script:
        "../scripts/poison_detection.py"


rule plot_influence:
    input:
        detection=rules.poison_detection.output.detection,
        roc=rules.poison_detection.output.roc,
        top=rules.poison_detection.output.top,
        conditioning=rules.poison_detection.output.conditioning,
        dataset=rules.prepare_data.output.dataset,
        code=get_code("plot_influence.py"),
    output:
        roc_png=report(
            layout.figure("poison_roc", "png"),
            caption="../report/poison_roc.rst",
            category="Influence",
            subcategory="{run}",
        ),
        roc_pdf=layout.figure("poison_roc", "pdf"),
        top_png=report(
            layout.figure("top_influential_images", "png"),
            caption="../report/top_influential_images.rst",
            category="Influence",
            subcategory="{run}",
        ),
        top_pdf=layout.figure("top_influential_images", "pdf"),
        conditioning_png=report(
            layout.figure("influence_conditioning", "png"),
            caption="../report/influence_conditioning.rst",
            category="Influence",
            subcategory="{run}",
        ),
        conditioning_pdf=layout.figure("influence_conditioning", "pdf"),
    log:
        layout.log("plot_influence"),
    benchmark:
        layout.benchmark("plot_influence")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        corruption=get_corruption,
    script:
        "../scripts/plot_influence.py"


rule lds_retrain:
    input:
        dataset=rules.prepare_data.output.dataset,
        class_order=rules.class_order.output.order,
        start=get_lds_start_checkpoint,
        data=get_lds_command_data,
        files=get_lds_command_files,
        code=get_code("lds_retrain.py"),
    output:
        part=layout.lds_part(),
    log:
        layout.log(
            "lds", index="{index}", epoch="{epoch}", name="retrain_{part}-of-{nparts}"
        ),
    benchmark:
        layout.benchmark(
            "lds", index="{index}", epoch="{epoch}", name="retrain_{part}-of-{nparts}"
        )
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        run=get_lds_retrain_run,
        lds=get_lds_retrain_settings,
        start_epoch=get_lds_start_epoch,
    script:
        "../scripts/lds_retrain.py"


rule lds_tables:
    input:
        scores=get_run_influence_scores,
        parts=get_lds_parts,
        code=get_code("lds_tables.py"),
    output:
        lds=layout.table("lds"),
        queries=layout.table("lds_queries"),
    log:
        layout.log("lds_tables"),
    benchmark:
        layout.benchmark("lds_tables")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        jobs=get_run_influence_jobs,
        checkpoints=get_lds_checkpoints,
        lds=get_lds_table_params,
    script:
        "../scripts/lds_tables.py"


rule plot_lds:
    input:
        lds=rules.lds_tables.output.lds,
        queries=rules.lds_tables.output.queries,
        code=get_code("plot_lds.py"),
    output:
        png=report(
            layout.figure("lds", "png"),
            caption="../report/lds.rst",
            category="Influence",
            subcategory="{run}",
        ),
        pdf=layout.figure("lds", "pdf"),
    log:
        layout.log("plot_lds"),
    benchmark:
        layout.benchmark("plot_lds")
    conda:
        "../envs/plots.yaml"
    envmodules:
        *config["envmodules"],
    script:
        "../scripts/plot_lds.py"


rule influence:
    input:
        influence_targets(),


localrules:
    influence,
    poison_detection,
    plot_influence,
    lds_tables,
    plot_lds,
