"""Rule ablation_tables: the run's ablation table, mean and spread over indices."""

import pandas as pd

from epochlens.ablation.summary import ablation_summary
from epochlens.atomic import write_atomic
from epochlens.runner import log, run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    rows = pd.concat([pd.read_csv(path) for path in snakemake.input.tables], ignore_index=True)
    summary = ablation_summary(rows)
    write_atomic(snakemake.output.summary, lambda path: summary.to_csv(path, index=False))
    log.info("%d ablation rows -> %d summary rows", len(rows), len(summary))


run_step(main, snakemake.log[0])
