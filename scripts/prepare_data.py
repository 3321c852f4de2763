"""Rule prepare_data: load the configured data source, apply data.corruption (if any), and write
the run's dataset.h5 (images, or a text run's tokens: epochlens.data.text) and the corrupted
training positions (corrupted_indices.npy).

By hand, from the run's working directory: python scripts/prepare_data.py run=digits
"""

import numpy as np
from _helpers import run_script

from epochlens.atomic import save_npy
from epochlens.data import holdout_mask, load_source, write_dataset
from epochlens.data.blocks import Spill
from epochlens.data.dataset import check_kind, describe
from epochlens.data.ground_truth import mark_positions
from epochlens.data.text import write_text_dataset
from epochlens.data.text_rows import open_any_dataset
from epochlens.formats.image_decode import ImageSettings
from epochlens.formats.images import IMAGE_SOURCES, load_images
from epochlens.formats.tables import TableSettings, load_table
from epochlens.formats.text import TextSettings, load_polarity, load_text, source_tokenizer
from epochlens.runner import log
from epochlens.study.corruption import corrupt
from epochlens.study.text_trigger import corrupt_text


def text_settings(cfg: dict, truth: str | None, hf_task: str | None) -> tuple[TextSettings, str | None]:
    """A text run's data.text settings and its tokenizer folder (None: polarity's own)."""
    text = dict(cfg.get("text") or {})
    tokenizer = text.pop("tokenizer", None)
    column = {"ground_truth_column": truth} if truth else {}
    return TextSettings(**text, **column, encoder_decoder=hf_task == "text_to_text"), tokenizer


def load(source: str, path: str | None, cfg: dict, truth: str | None, hf_task: str | None, spill: Spill):
    """The data set before corruption (your ground-truth column ``truth``; a large split's images
    and a text run's tokens in ``spill``), read here only: editing a reader reruns no other stage."""
    column = {"ground_truth_column": truth} if truth else {}
    if "text" in cfg or source == "polarity":
        settings, tokenizer = text_settings(cfg, truth, hf_task)
        if source == "polarity":
            return load_polarity(settings, **cfg.get("polarity", {}), scratch=spill.group("text"))
        return load_text(source, path, settings, tokenizer, spill.group("text"))
    if "table" in cfg:
        return load_table(source, path, TableSettings(**cfg["table"], **column), cfg.get("normalize", "auto"))
    if source in IMAGE_SOURCES:
        return load_images(source, path, ImageSettings(**cfg.get("images", {}), **column), spill)
    return load_source(source, path, **cfg, **column)


def main(snakemake) -> None:
    cfg = dict(snakemake.params.data)
    corruption, truth = cfg.pop("corruption", None) or {"kind": "none"}, cfg.pop("ground_truth", None) or {}
    hf_task, source = snakemake.params.hf_task, cfg.pop("source")
    with Spill(snakemake.output.dataset) as spill:  # images and tokens on disk until written
        dataset = load(source, cfg.pop("path", None), cfg, truth.get("column"), hf_task, spill)
        check_kind(dataset, snakemake.params.task)
        if truth.get("indices"):  # your poisoned samples' positions in the training split
            mark_positions(dataset, truth["indices"])
        holdout = cfg.get("holdout_per_class", 0)  # the holdout first: it is never corrupted
        dataset.holdout = holdout_mask(dataset.train_labels, holdout)
        is_text = hasattr(dataset, "train_input_ids")
        if is_text and corruption["kind"] == "trigger":  # the phrase is tokenised by the data's tokenizer
            settings, folder = text_settings(cfg, truth.get("column"), hf_task)
            tokenizer = source_tokenizer(source, settings, folder)
            dataset, corrupted = corrupt_text(dataset, corruption, tokenizer, settings)
        else:
            dataset, corrupted = corrupt(dataset, corruption)
        if dataset.ground_truth is not None:  # yours, instead of a corruption of the pipeline's
            corrupted = np.flatnonzero(dataset.ground_truth).astype(np.int64)
            log.info("ground truth: %d poisoned training samples (%s)", len(corrupted), truth)
        (write_text_dataset if is_text else write_dataset)(dataset, snakemake.output.dataset)
    log.info(describe(open_any_dataset(snakemake.output.dataset)))  # the hash written, not hashed again
    save_npy(snakemake.output.corrupted, corrupted)
    if (kind := corruption["kind"]) != "none":
        log.info("corruption %s: %d training samples (%s)", kind, len(corrupted), dataset.source)


if __name__ == "__main__":
    run_script(main, "prepare_data", globals().get("snakemake"))
