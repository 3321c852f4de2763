"""Rule prepare_data: load the configured data source and write results/{run}/data/dataset.h5."""

from epochlens.data import holdout_mask, load_source, write_dataset
from epochlens.runner import log, run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    cfg = dict(snakemake.params.data)
    dataset = load_source(cfg.pop("source"), cfg.pop("path", None), **cfg)
    dataset.holdout = holdout_mask(dataset.train_labels, cfg.get("holdout_per_class", 0))
    write_dataset(dataset, snakemake.output.dataset)
    log.info(
        "%s: %d train (%d holdout) / %d test images %s, %d classes, hash %s",
        dataset.name,
        len(dataset.train_labels),
        int(dataset.holdout.sum()),
        len(dataset.test_labels),
        tuple(dataset.train_images.shape[1:]),
        dataset.num_classes,
        dataset.content_hash[:12],
    )


run_step(main, snakemake.log[0])
