# Helpers of rules/evaluate.smk: input functions, params and targets.


def get_eval_tables(wildcards):
    return per_checkpoint(wildcards.run, layout.eval_table, get_epochs(wildcards.run))


def get_eval_params(wildcards):
    """The run's config without the analysis sections: changing those reruns no evaluation."""
    return run_config.run_params(get_run(wildcards))
