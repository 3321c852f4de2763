# The run's data set (with data.corruption applied) and each replicate's class order.


include: "helpers/data.smk"


rule prepare_data:
    input:
        source=get_data_source_files,
        code=get_code("prepare_data.py"),
    output:
        dataset=layout.dataset(),
        corrupted=layout.corrupted_indices(),
    log:
        layout.log("prepare_data"),
    benchmark:
        layout.benchmark("prepare_data")
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    resources:
        mem_mb=get_prepare_data_mem_mb,
    params:
        data=get_data_params,
        task=get_task_name,
        hf_task=get_hf_task,
    script:
        "../scripts/prepare_data.py"


rule class_order:
    input:
        dataset=rules.prepare_data.output.dataset,
        user_file=get_user_class_order,
        code=get_code("class_order.py"),
    output:
        order=layout.class_order(),
    log:
        layout.log("class_order", index="{index}"),
    conda:
        "../envs/epochlens.yaml"
    envmodules:
        *config["envmodules"],
    params:
        spec=config_provider("class_order"),
    script:
        "../scripts/class_order.py"
