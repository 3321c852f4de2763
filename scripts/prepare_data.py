"""Rule prepare_data: load the configured data source, apply data.corruption (if any), and write
the run's dataset.h5 (images, or a text run's tokens: epochlens.data.text) and the corrupted
training positions (corrupted_indices.npy).

By hand, from the run's working directory: python scripts/prepare_data.py run=digits
"""

from _helpers import run_script

from epochlens.atomic import save_npy
from epochlens.data import holdout_mask, load_source, write_dataset
from epochlens.data.dataset import check_kind
from epochlens.data.text import write_text_dataset
from epochlens.formats.images import IMAGE_SOURCES, ImageSettings, load_images
from epochlens.formats.tables import TableSettings, load_table
from epochlens.formats.text import TextSettings, load_polarity, load_text
from epochlens.runner import log
from epochlens.study.corruption import corrupt


def load(source: str, path: str | None, cfg: dict):
    """The data set before corruption; your images and texts are read here only (so an edit of
    their reader reruns no other stage)."""
    if "text" in cfg or source == "polarity":
        text = dict(cfg.get("text") or {})
        tokenizer = text.pop("tokenizer", None)
        settings = TextSettings(**text)
        if source == "polarity":
            return load_polarity(settings, **cfg.get("polarity", {}))
        return load_text(source, path, settings, tokenizer)
    if "table" in cfg:
        return load_table(source, path, TableSettings(**cfg["table"]), cfg.get("normalize", "auto"))
    if source in IMAGE_SOURCES:
        return load_images(source, path, ImageSettings(**cfg.get("images", {})))
    return load_source(source, path, **cfg)


def main(snakemake) -> None:
    cfg = dict(snakemake.params.data)
    corruption = cfg.pop("corruption", None) or {"kind": "none"}
    dataset = load(cfg.pop("source"), cfg.pop("path", None), cfg)
    check_kind(dataset, snakemake.params.task)
    # The holdout first: it is never corrupted (not trained on).
    dataset.holdout = holdout_mask(dataset.train_labels, cfg.get("holdout_per_class", 0))
    dataset, corrupted = corrupt(dataset, corruption)
    is_text = hasattr(dataset, "train_input_ids")
    (write_text_dataset if is_text else write_dataset)(dataset, snakemake.output.dataset)
    save_npy(snakemake.output.corrupted, corrupted)
    shape = dataset.train_input_ids.shape[1:] if is_text else dataset.train_images.shape[1:]
    regression = getattr(dataset, "kind", "") == "regression"
    log.info(
        "%s: %d train (%d holdout) / %d test %s %s, %s, hash %s",
        dataset.name,
        len(dataset.train_labels),
        int(dataset.holdout.sum()),
        len(dataset.test_labels),
        "texts of tokens" if is_text else "inputs",
        tuple(shape),
        f"{dataset.train_labels.dtype} targets {dataset.train_labels.shape[1:]}"
        if regression
        else f"{dataset.num_classes} classes",
        dataset.content_hash[:12],
    )
    if corruption["kind"] != "none":
        log.info(
            "corruption %s: %d training samples (%s)", corruption["kind"], len(corrupted), dataset.source
        )


if __name__ == "__main__":
    run_script(main, "prepare_data", globals().get("snakemake"))
