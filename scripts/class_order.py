"""Rule class_order: the replicate's class order, from a seed or from the user's .npy file.

By hand, from the run's working directory: python scripts/class_order.py run=digits index=0
"""

from _helpers import run_script

from epochlens.atomic import save_npy
from epochlens.data.labels import read_num_classes
from epochlens.runner import log
from epochlens.schedule import load_class_order, make_class_order


def main(snakemake) -> None:
    spec = snakemake.params.spec
    num_classes = read_num_classes(snakemake.input.dataset)
    if spec["source"] == "file":
        order = load_class_order(snakemake.input.user_file[0], num_classes)
    else:
        order = make_class_order(num_classes, spec["seed"] + int(snakemake.wildcards.index))
    save_npy(snakemake.output.order, order)
    log.info("class order: %s", order.tolist())


if __name__ == "__main__":
    run_script(main, "class_order", globals().get("snakemake"))
