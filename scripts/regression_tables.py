"""Rule regression_tables: a regression run's evaluation tables in one (every index, checkpoint,
split and data group: n, mean loss, MSE, MAE, R²), and their mean and 95% interval over indices.

By hand, from the run's working directory: python scripts/regression_tables.py run=inverse
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.atomic import write_atomic, write_json
from epochlens.evaluation import regression_summary
from epochlens.formats.trainer_folders import insert_training_epochs
from epochlens.provenance import table_provenance


def main(snakemake) -> None:
    out = snakemake.output
    tables = [pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in snakemake.input.tables]
    metrics = pd.concat(tables, ignore_index=True)
    metrics = metrics.sort_values(["index", "epoch", "split"], kind="stable").reset_index(drop=True)
    run_cfg = snakemake.config["runs"][snakemake.wildcards.run]
    insert_training_epochs(metrics, run_cfg["checkpoints"])
    summary = regression_summary(metrics)
    write_atomic(out.metrics, lambda p: metrics.to_csv(p, index=False))
    write_atomic(out.summary, lambda p: summary.to_csv(p, index=False))
    tables = [out.metrics, out.summary]
    write_json(out.provenance, table_provenance(run_cfg, snakemake.input.tables, tables))


if __name__ == "__main__":
    run_script(main, "regression_tables", globals().get("snakemake"))
