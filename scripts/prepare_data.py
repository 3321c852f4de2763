"""Rule prepare_data: load the configured data source, apply data.corruption (if any), and write
results/{run}/data/dataset.h5 and the corrupted training positions (corrupted_indices.npy)."""

import numpy as np

from epochlens.atomic import save_npy
from epochlens.data import holdout_mask, load_source, write_dataset
from epochlens.runner import log, run_step
from epochlens.study.corruption import flip_labels, plant_trigger

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    cfg = dict(snakemake.params.data)
    corruption = cfg.pop("corruption", None) or {"kind": "none"}
    dataset = load_source(cfg.pop("source"), cfg.pop("path", None), **cfg)
    # The holdout first: it is never corrupted (not trained on).
    dataset.holdout = holdout_mask(dataset.train_labels, cfg.get("holdout_per_class", 0))
    corrupted = np.zeros(0, dtype=np.int64)
    kind = corruption["kind"]
    if kind == "label_flip":
        dataset, corrupted = flip_labels(dataset, corruption["fraction"], corruption["seed"])
    elif kind == "trigger":
        dataset, corrupted = plant_trigger(
            dataset,
            corruption["fraction"],
            corruption["target_class"],
            corruption["seed"],
            corruption["patch_size"],
            corruption["corner"],
        )
    write_dataset(dataset, snakemake.output.dataset)
    save_npy(snakemake.output.corrupted, corrupted)
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
    if kind != "none":
        log.info("corruption %s: %d training images (%s)", kind, len(corrupted), dataset.source)


run_step(main, snakemake.log[0])
