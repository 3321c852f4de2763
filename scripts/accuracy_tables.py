"""Rule accuracy_tables: concatenate per-checkpoint tables; aggregate to task cohorts, old vs new."""

import pandas as pd

from epochlens.atomic import write_atomic, write_json
from epochlens.evaluation import cohort_table
from epochlens.provenance import table_provenance
from epochlens.runner import run_step
from epochlens.stats import over_replicates

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    per_class = pd.concat([pd.read_csv(p) for p in snakemake.input.tables], ignore_index=True)
    per_class = per_class.sort_values(["index", "epoch", "split", "position"])
    cohorts = cohort_table(per_class, snakemake.params.epochs_per_task)
    cohorts.insert(0, "run", snakemake.wildcards.run)
    write_atomic(snakemake.output.per_class, lambda p: per_class.to_csv(p, index=False))
    write_atomic(snakemake.output.cohorts, lambda p: cohorts.to_csv(p, index=False))
    # mean and Student-t 95% interval over replicate indices
    summary = over_replicates(cohorts, ["run", "epoch", "split", "group", "cohort"], ["accuracy"])
    write_atomic(snakemake.output.summary, lambda p: summary.to_csv(p, index=False))
    out = snakemake.output
    write_json(
        out.provenance,
        table_provenance(
            snakemake.config["runs"][snakemake.wildcards.run],
            snakemake.input.tables,
            [out.per_class, out.cohorts, out.summary],
        ),
    )


run_step(main, snakemake.log[0])
