"""Rule poison_detection: how well each influence method finds the corrupted training images of a
run (AUROC, precision at k against the loss and random baselines), the agreement of the rankings
across query transforms, ROC curves, the top-ranked images and per-layer conditioning.

By hand, from the run's working directory: python scripts/poison_detection.py run=digits_noisy
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import numpy as np
from _helpers import run_script

from epochlens.atomic import write_atomic
from epochlens.data.labels import read_labels
from epochlens.outcome import sample_classes
from epochlens.runner import log
from epochlens.study.poison import detection_tables


def main(snakemake) -> None:
    inp, out, p = snakemake.input, snakemake.output, snakemake.params
    corrupted = np.load(inp.corrupted)
    if len(corrupted) == 0:
        log.warning(
            "no corrupted training images known (neither data.corruption nor data.ground_truth): the "
            "detection table's AUROC is empty, its status says why"
        )
    # Not the images: a table job stays light. A causal LM's token labels: class 0 (no classes); a
    # regression's float targets as they are (the top-ranked table's target column).
    labels = read_labels(inp.dataset, "train").labels
    labels = labels if np.issubdtype(labels.dtype, np.floating) else sample_classes(labels)
    study = p.study
    tables = detection_tables(
        snakemake.wildcards.run, p.jobs, inp.scores, inp.diagnostics, corrupted, labels,
        study["seed"], study["top_k"], study["reduce"],
    )  # fmt: skip
    for name, df in tables.items():
        write_atomic(out[name], lambda path, df=df: df.to_csv(path, index=False))
    summary = (
        tables["detection"].groupby(["method", "signal"], sort=False)[["auroc", "precision_at_k"]].mean()
    )
    log.info(
        "%d corrupted training images; detection (mean over indices and epochs):\n%s", len(corrupted), summary
    )


if __name__ == "__main__":
    run_script(main, "poison_detection", globals().get("snakemake"))
