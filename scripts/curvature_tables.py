"""Rule curvature_tables: per-sample CSL / learning time and per-cohort curvature of one run."""

from pathlib import Path

import numpy as np
import pandas as pd

from epochlens.atomic import write_atomic, write_json
from epochlens.curvature.dynamics import cohort_curvature, sample_dynamics
from epochlens.curvature.io import read_epoch
from epochlens.provenance import table_provenance
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config
from epochlens.stats import over_replicates

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    p = snakemake.params
    epochs, run = p.epochs, snakemake.wildcards.run
    # metadata.json of each (index, epoch), index-major: the epoch folders to read
    folders = [Path(m).parent for m in snakemake.input.metadata]
    samples, cohorts, pooled_results, pooled_tasks = [], [], [], []
    for k, (index, class_order) in enumerate(zip(p.indices, snakemake.input.class_orders, strict=True)):
        task_of_class = schedule_from_config(p.schedule, class_order).task_of_class()
        results = [read_epoch(folder)[1] for folder in folders[k * len(epochs) : (k + 1) * len(epochs)]]
        table = sample_dynamics(epochs, results, task_of_class, p.epochs_per_task)
        samples.append(table.assign(index=index))
        sample_task = task_of_class[results[0]["labels"]]
        cohorts.append(cohort_curvature(epochs, results, sample_task, p.epochs_per_task).assign(index=index))
        pooled_results.append(results)
        pooled_tasks.append(sample_task)
        learned = table["learning_time"].notna().mean()
        log.info("index %s: %d samples, %.0f%% learned by the last epoch", index, len(table), 100 * learned)

    # Distribution over the images of every index together (box plots): concatenate per epoch.
    per_epoch = [
        {key: np.concatenate([res[k][key] for res in pooled_results]) for key in pooled_results[0][k]}
        for k in range(len(epochs))
    ]
    pooled = cohort_curvature(epochs, per_epoch, np.concatenate(pooled_tasks), p.epochs_per_task)

    def first(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
        df.insert(0, "run", run)
        return df[["run", *cols, *[c for c in df.columns if c not in ("run", *cols)]]]

    tables = {
        "samples": first(pd.concat(samples, ignore_index=True), "index", "sample"),
        "cohorts": first(pd.concat(cohorts, ignore_index=True), "index", "epoch"),
        "distribution": first(pooled, "epoch"),
    }
    # mean and Student-t 95% interval over replicate indices
    metrics = ["n", "curvature_mean", "curvature_q50", "loss_mean", "accuracy"]
    tables["summary"] = over_replicates(tables["cohorts"], ["run", "epoch", "group", "cohort"], metrics)
    for key, df in tables.items():
        write_atomic(snakemake.output[key], lambda path, df=df: df.to_csv(path, index=False))
    write_json(
        snakemake.output.provenance,
        table_provenance(
            snakemake.config["runs"][run],
            [*snakemake.input.arrays, *snakemake.input.class_orders],  # not metadata.json: it holds timings
            [snakemake.output[key] for key in tables],
        ),
    )


run_step(main, snakemake.log[0])
