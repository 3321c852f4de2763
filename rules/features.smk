# Per-layer features of every training and test image at each checkpoint (features.epochs),
# written to features/epoch_{E}.h5 with their cache key (checkpoint hash, data key, layer and
# representation spec). Params hold the spec only: Snakemake reruns a job exactly when the key
# would change (another checkpoint, data set or spec); batch size and device, which do not change
# the features, are read from the config by the script.


rule features_epoch:
    input:
        dataset=get_dataset,
        checkpoint=get_checkpoint,
        code=get_code("features_epoch.py"),
    output:
        features="results/{run}/index-{index}/features/epoch_{epoch}.h5",
    log:
        "results/{run}/logs/features/index-{index}/epoch_{epoch}.log",
    benchmark:
        "results/{run}/benchmarks/features/index-{index}/epoch_{epoch}.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        settings=get_feature_settings,
        model=get_model_name,
    script:
        "../scripts/features_epoch.py"


rule features:
    input:
        get_all_features(),
