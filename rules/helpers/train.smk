# Helpers of rules/train.smk: input functions, params and targets.


def get_trained_runs():
    return [
        r
        for r, spec in config["runs"].items()
        if spec["checkpoints"]["source"] == "train"
    ]


def get_trained_checkpoints(run):
    """Output paths of run's training job (``{index}`` left as a wildcard)."""
    epochs = run_config.checkpoint_epochs(config["runs"][run])
    return [layout.checkpoint(run, "{index}", e) for e in epochs]


def get_train_resources():
    """Resources of a training job on a cluster: one GPU (the standard `gpu` resource, which the
    SLURM executor requests with --gpus; none with device: cpu) with 4 CPU cores (--cpus-per-gpu), host memory in MB and
    wall time in minutes; the same as the GPU rules in profiles/slurm/config.yaml, except that the
    time does not grow with the attempt: a retried training resumes where it stopped. The training rules are named after the config's
    runs (train_<run>), so a profile cannot name them in advance: a profile overrides them per run
    with set-resources: train_<run>: {...}. Local runs ignore them unless --resources limits one
    (e.g. --resources gpu=1: one GPU job at a time on a one-GPU machine).
    """
    return {**get_gpu_resources(), "cpus_per_gpu": 4, "mem_mb": 16000, "runtime": 240}
