"""Rule poison_detection: how well each influence method finds the corrupted training images of a
run (AUROC, precision at k against the loss and random baselines), the agreement of the rankings
across query transforms, ROC curves, the top-ranked images and per-layer conditioning."""

import numpy as np
import pandas as pd

from epochlens.data import read_dataset
from epochlens.influence.io import save_table
from epochlens.runner import log, run_step
from epochlens.study.detection import baseline_signals, detection_table, transform_agreement
from epochlens.study.poison import query_signal_name, roc_table, study_signals, top_ranked

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    inp, out, p = snakemake.input, snakemake.output, snakemake.params
    corrupted = np.load(inp.corrupted)
    labels = read_dataset(inp.dataset).train_labels
    study = p.study
    if len(corrupted) == 0:
        log.warning("no corrupted training images (data.corruption absent or kind: none): AUROC is NaN")

    detection, agreement, roc, top, conditioning = [], [], [], [], []
    baselines_done = set()
    for job, scores_path, diag_path in zip(p.jobs, inp.scores, inp.diagnostics, strict=True):
        index, epoch, method = int(job["index"]), int(job["epoch"]), job["method"]
        key = {"index": index, "epoch": epoch}
        with np.load(scores_path) as npz:
            arrays = {name: npz[name] for name in npz.files}
        transforms = [name.removeprefix("pairwise_") for name in arrays if name.startswith("pairwise_")]
        pairwise = {t: arrays[f"pairwise_{t}"] for t in transforms}
        signals = study_signals(
            method, arrays["self_influence"], pairwise, float(arrays["query_sign"]), study["reduce"]
        )
        if (index, epoch) not in baselines_done:  # the loss and random baselines once per checkpoint
            baselines_done.add((index, epoch))
            signals.update(baseline_signals(arrays["loss"], seed=study["seed"] + index))
        detection.append(detection_table(signals, corrupted, epoch, index))
        roc.append(roc_table(signals, corrupted).assign(**key))
        top.append(top_ranked(signals, corrupted, labels, study["top_k"]).assign(**key))
        if len(transforms) > 1:
            per_transform = {t: signals[(method, query_signal_name(t))] for t in transforms}
            agree = transform_agreement(per_transform).assign(scores="query_signal")
            flat = transform_agreement({t: pairwise[t] for t in transforms}).assign(scores="pairwise")
            agreement.append(pd.concat([agree, flat]).assign(method=method, **key))
        diag = pd.read_csv(diag_path)
        conditioning.append(diag.assign(method=method, **key))
        n_queries = len(arrays["query_labels"])
        log.info("index %d epoch %d %s: %d queries", index, epoch, method, n_queries)

    table = pd.concat(detection, ignore_index=True)
    run = snakemake.wildcards.run

    def first(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
        df = df.copy()
        df.insert(0, "run", run)
        return df[["run", *cols, *[c for c in df.columns if c not in ("run", *cols)]]]

    agreement_cols = ["index", "epoch", "method", "scores", "transform_a", "transform_b", "spearman", "n"]
    tables = {
        "detection": table,  # columns exactly epochlens.study.detection.DETECTION_COLUMNS
        "agreement": first(pd.concat(agreement, ignore_index=True), *agreement_cols[:4])
        if agreement
        else pd.DataFrame(columns=["run", *agreement_cols]),
        "roc": first(pd.concat(roc, ignore_index=True), "index", "epoch", "method", "signal"),
        "top": first(pd.concat(top, ignore_index=True), "index", "epoch", "method", "signal"),
        "conditioning": first(
            pd.concat(conditioning, ignore_index=True), "index", "epoch", "method", "layer"
        ),
    }
    for name, df in tables.items():
        save_table(out[name], df)
    summary = table.groupby(["method", "signal"], sort=False)[["auroc", "precision_at_k"]].mean()
    log.info(
        "%d corrupted training images; detection (mean over indices and epochs):\n%s", len(corrupted), summary
    )


run_step(main, snakemake.log[0])
