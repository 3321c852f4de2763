# Per-layer features of every training and test image at each checkpoint (features.epochs),
# written to features/epoch_{E}.h5 with their cache key (checkpoint hash, data key, layer and
# representation spec); for a text run, each block's hidden states (mean over the real tokens,
# last real token; a causal LM's prompt_last, target_mean; a text-to-text model's encoder and
# decoder blocks, mean and first: epochlens.features.text) in the same file format. Params hold
# the spec only (epochlens.config.feature_params): Snakemake
# reruns a job exactly when the key would change (another checkpoint, data set or spec); batch
# size and device, which do not change the features, are read from the config by the script.


include: "helpers/features.smk"


rule features_epoch:
    input:
        dataset=rules.prepare_data.output.dataset,
        checkpoint=get_checkpoint,
        model_code=get_model_code,
        code=get_code("features_epoch.py"),
    output:
        features=layout.features(),
    log:
        layout.log("features", index="{index}", epoch="{epoch}"),
    benchmark:
        layout.benchmark("features", index="{index}", epoch="{epoch}")
    wildcard_constraints:
        run=runs_pattern(stored=False),
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        **get_gpu_resources(),
    params:
        settings=get_feature_params,
        model=get_model_param,
    script:
        "../scripts/features_epoch.py"


# A run of stored activations (checkpoints.source: activations): one features file per
# (snapshot, representation), in the same file format, built from the user's snapshot folder a
# layer at a time with no model (epochlens.features.stored). A representation is its own job, so
# editing a user representation's files (its input here) or its settings reruns that
# representation's features and probes only, never the others'. A parquet snapshot is first
# decoded once into .npy layers (activations/epoch_{E}/, rule activations_decoded): Arrow decodes
# parquet at about 0.01x a plain read, which each representation's job would pay again. The folder
# stays (as many bytes as the activations): a representation added or edited later reads it, and
# the others do not rerun (a temporary one, decoded again, would rerun them all).
rule activations_decoded:
    input:
        dataset=rules.prepare_data.output.dataset,
        snapshot=get_snapshot,
        code=get_code("activations_decoded.py"),
    output:
        folder=directory(layout.decoded_activations()),
    log:
        layout.log("features", index="{index}", epoch="{epoch}", name="decode"),
    benchmark:
        layout.benchmark("features", index="{index}", epoch="{epoch}", name="decode")
    wildcard_constraints:
        run=runs_pattern(stored=True),
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    threads: 4
    params:
        settings=get_decode_params,
    script:
        "../scripts/activations_decoded.py"


rule features_stored:
    input:
        dataset=rules.prepare_data.output.dataset,
        snapshot=get_stored_snapshot,
        representation_code=get_stored_code,
        code=get_code("features_stored.py"),
    output:
        features=layout.stored_features(),
    log:
        layout.log(
            "features", index="{index}", epoch="{epoch}", name="{representation}"
        ),
    benchmark:
        layout.benchmark(
            "features", index="{index}", epoch="{epoch}", name="{representation}"
        )
    wildcard_constraints:
        run=runs_pattern(stored=True),
        representation=r"[A-Za-z_][A-Za-z0-9_.-]*",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        settings=get_stored_feature_params,
    script:
        "../scripts/features_stored.py"


rule features:
    input:
        feature_targets(),


localrules:
    features,
