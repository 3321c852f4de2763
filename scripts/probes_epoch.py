"""Rule probes_epoch: linear probes on one checkpoint's cached features, one row per seed."""

import numpy as np
import pandas as pd

from epochlens.atomic import write_atomic
from epochlens.data import read_dataset
from epochlens.errors import DataError
from epochlens.features.cache import FeatureSet
from epochlens.probes.linear import probe_features
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.targets import standard_targets
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config, task_at_epoch

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
    run, index, epoch = wc.run, int(wc.index), int(wc.epoch)
    features = FeatureSet(inp.features)
    data = read_dataset(inp.dataset)
    if features.attrs.get("data_content_hash") != data.content_hash:
        raise DataError(
            f"{inp.features} holds features of another data set than {inp.dataset}; delete it and rerun."
        )
    schedule = schedule_from_config(p.schedule, inp.class_order)
    active = schedule.active_classes(epoch)
    newest = int(task_at_epoch(epoch, schedule.epochs_per_task))
    new = active[schedule.task_of_class()[active] == newest]
    wanted = p.probes["targets"]
    bins = p.probes["curvature_bins"]
    curvature = np.load(inp.curvature[0]) if inp.curvature else None
    targets = standard_targets(
        {split: features.labels(split) for split in ("train", "test")},
        active,
        new if "cohort" in wanted else None,
        curvature,
        bins,
    )
    skipped = {}
    if "class" not in wanted:
        del targets["class"]
    if "cohort" in wanted and "cohort" not in targets:
        skipped["cohort"] = "skipped: no old classes yet (first task)"
    if "curvature" in wanted and curvature is None:
        skipped[f"curvature_q{bins}"] = "skipped: curvature not computed at this epoch"
    fit = ~data.holdout
    for name in list(targets):
        y = targets[name]["train"][fit]
        if len(np.unique(y[y >= 0])) < 2:
            skipped[name] = "skipped: fewer than two target values among the fit images"
            del targets[name]
    for name, why in skipped.items():
        log.info("target %s %s", name, why)

    context = {"run": run, "index": index, "epoch": epoch}
    settings = ProbeSettings(**p.probes["settings"])
    parts = []
    if targets:
        device = snakemake.config["device"]
        table = probe_features(
            features, targets, data.holdout, settings, context=context, device=device, progress=True
        )
        parts.append(table.assign(status="ok"))
        holdout = table[table["eval_split"] == "holdout"]
        for name, acc in holdout.groupby("target", sort=False)["accuracy"]:
            log.info(
                "epoch %d, target %s: holdout accuracy %.3f .. %.3f over layers",
                epoch,
                name,
                acc.min(),
                acc.max(),
            )
    pairs = [(layer, rep) for layer in features.layers for rep in features.representations]
    if skipped:
        rows = [
            {**context, "layer": layer, "representation": rep, "target": name, "status": why}
            for name, why in skipped.items()
            for layer, rep in pairs
        ]
        parts.append(pd.DataFrame(rows))
    out = pd.concat(parts, ignore_index=True)
    counts = ["seed", "n_features", "n_classes", "n_fit", "n_stop", "n_eval", "best_epoch", "epochs_run"]
    out[counts] = out.reindex(columns=counts).astype("Int64")  # skipped rows: empty, not 0.0
    write_atomic(snakemake.output.table, lambda path: out.to_csv(path, index=False))


run_step(main, snakemake.log[0])
