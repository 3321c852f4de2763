"""Rule class_order: the replicate's class order, from a seed or from the user's .npy file."""

from epochlens.atomic import save_npy
from epochlens.data import read_dataset
from epochlens.runner import log, run_step
from epochlens.schedule import load_class_order, make_class_order

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    spec = snakemake.params.spec
    num_classes = read_dataset(snakemake.input.dataset).num_classes
    if spec["source"] == "file":
        order = load_class_order(snakemake.input.user_file[0], num_classes)
    else:
        order = make_class_order(num_classes, spec["seed"] + int(snakemake.wildcards.index))
    save_npy(snakemake.output.order, order)
    log.info("class order: %s", order.tolist())


run_step(main, snakemake.log[0])
