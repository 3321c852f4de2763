# epochlens: per-sample analyses of a training run (checkpoints + data set).
#
#   snakemake --profile profiles/default                 # the embedded default (digits)
#   snakemake --configfile config/cifar100_lop.yaml ...  # the loss-of-plasticity CIFAR-100 study
#   snakemake figures                                    # redraw figures from cached tables
#
# The DAG per run:  prepare_data -> class_order -> train_<run> (or the user's checkpoint folder)
#                   -> evaluate_checkpoint (one job per index x epoch) -> accuracy_tables -> plots
#                   -> curvature_shard (index x epoch x shard) -> curvature_epoch (merge)
#                   -> features_epoch (index x epoch) -> probes_epoch -> probe_tables -> plot_probes
#                   (stored activations: features_stored -> probes_stored, index x epoch x representation)
#                   -> ablation_epoch (index x epoch) -> ablation_tables -> plot_ablation
#                   -> influence_factors, influence_scores (index x epoch x method)
#                      -> poison_detection -> plot_influence
# Across runs (config comparisons): each run's tables -> comparison_tables -> plot_comparisons
# Paths: epochlens.layout; config logic: epochlens.config; one .smk file per stage.


from snakemake.utils import min_version

min_version("9.0")


# The embedded default (digits) only when no --configfile is given: a user's config file is the whole
# configuration, not an addition to the demo's runs. --config key=value alone still edits the default.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"


validate_config(config)


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    index=r"\d+",
    epoch=r"\d\d\d\d+",
    shard=r"\d+",
    nshards=r"\d+",
    part=r"\d+",
    nparts=r"\d+",


include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/curvature.smk"
include: "rules/features.smk"
include: "rules/probes.smk"
include: "rules/ablation.smk"
include: "rules/influence.smk"
include: "rules/samples.smk"
include: "rules/compare.smk"
include: "rules/figures.smk"
include: "rules/explorer.smk"


localrules:
    all,


rule all:
    default_target: True
    input:
        all_targets(),
