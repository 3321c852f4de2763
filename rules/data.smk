rule prepare_data:
    input:
        source=get_data_source_files,
        code=get_code("prepare_data.py"),
    output:
        dataset="results/{run}/data/dataset.h5",
        corrupted="results/{run}/data/corrupted_indices.npy",
    log:
        "results/{run}/logs/prepare_data.log",
    benchmark:
        "results/{run}/benchmarks/prepare_data.tsv"
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        data=get_data_params,
    script:
        "../scripts/prepare_data.py"


rule class_order:
    input:
        dataset=get_dataset,
        user_file=get_user_class_order,
        code=get_code("class_order.py"),
    output:
        order="results/{run}/index-{index}/class_order.npy",
    log:
        "results/{run}/logs/class_order/index-{index}.log",
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        spec=get_class_order_params,
    script:
        "../scripts/class_order.py"
