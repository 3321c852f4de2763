"""Rule prepare_data: load the configured data source, apply data.corruption (if any), and write
the run's dataset.h5 and the corrupted training positions (corrupted_indices.npy).

By hand, from the run's working directory: python scripts/prepare_data.py run=digits
"""

from _helpers import run_script

from epochlens.atomic import save_npy
from epochlens.data import holdout_mask, load_source, write_dataset
from epochlens.formats.images import IMAGE_SOURCES, ImageSettings, load_images
from epochlens.runner import log
from epochlens.study.corruption import corrupt


def main(snakemake) -> None:
    cfg = dict(snakemake.params.data)
    corruption = cfg.pop("corruption", None) or {"kind": "none"}
    source, path = cfg.pop("source"), cfg.pop("path", None)
    # Your images are read here only (so an edit of their reader reruns no other stage).
    if source in IMAGE_SOURCES:
        dataset = load_images(source, path, ImageSettings(**cfg.get("images", {})))
    else:
        dataset = load_source(source, path, **cfg)
    # The holdout first: it is never corrupted (not trained on).
    dataset.holdout = holdout_mask(dataset.train_labels, cfg.get("holdout_per_class", 0))
    dataset, corrupted = corrupt(dataset, corruption)
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
    if corruption["kind"] != "none":
        log.info("corruption %s: %d training images (%s)", corruption["kind"], len(corrupted), dataset.source)


if __name__ == "__main__":
    run_script(main, "prepare_data", globals().get("snakemake"))
