"""Rule accuracy_tables: concatenate per-checkpoint tables; aggregate to task cohorts, old vs new."""

import pandas as pd

from epochlens.atomic import write_atomic
from epochlens.evaluation import cohort_table
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    per_class = pd.concat([pd.read_csv(p) for p in snakemake.input.tables], ignore_index=True)
    per_class = per_class.sort_values(["index", "epoch", "split", "position"])
    cohorts = cohort_table(per_class, snakemake.params.epochs_per_task)
    cohorts.insert(0, "run", snakemake.wildcards.run)
    write_atomic(snakemake.output.per_class, lambda p: per_class.to_csv(p, index=False))
    write_atomic(snakemake.output.cohorts, lambda p: cohorts.to_csv(p, index=False))


run_step(main, snakemake.log[0])
