"""Rule probe_tables: the run's probe table, mean and spread over probe seeds and indices."""

import pandas as pd

from epochlens.atomic import write_atomic
from epochlens.probes.summary import probe_summary
from epochlens.runner import log, run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    per_seed = pd.concat([pd.read_csv(path) for path in snakemake.input.tables], ignore_index=True)
    summary = probe_summary(per_seed)
    write_atomic(snakemake.output.summary, lambda path: summary.to_csv(path, index=False))
    skipped = summary[summary["status"] != "ok"]
    log.info("%d probe rows -> %d summary rows (%d skipped)", len(per_seed), len(summary), len(skipped))


run_step(main, snakemake.log[0])
