"""Rule accuracy_tables: concatenate per-checkpoint tables; aggregate to task cohorts, old vs new,
and to data groups (data with a group column; no rows otherwise).

By hand, from the run's working directory: python scripts/accuracy_tables.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.atomic import write_atomic, write_json
from epochlens.evaluation import cohort_table, group_table
from epochlens.formats.trainer_folders import insert_training_epochs
from epochlens.provenance import table_provenance
from epochlens.stats import over_replicates


def main(snakemake) -> None:
    out = snakemake.output
    per_class = pd.concat([pd.read_csv(p) for p in snakemake.input.tables], ignore_index=True)
    per_class = per_class.sort_values(["index", "epoch", "split", "position"])
    cohorts = cohort_table(per_class, snakemake.params.epochs_per_task)
    cohorts.insert(0, "run", snakemake.wildcards.run)
    # A Trainer folder's checkpoints are numbered by step: the epoch each was written at, too.
    run_cfg = snakemake.config["runs"][snakemake.wildcards.run]
    for table in (per_class, cohorts):
        insert_training_epochs(table, run_cfg["checkpoints"])
    groups = group_table(per_class)
    groups.insert(0, "run", snakemake.wildcards.run)
    write_atomic(out.per_class, lambda p: per_class.to_csv(p, index=False))
    write_atomic(out.cohorts, lambda p: cohorts.to_csv(p, index=False))
    write_atomic(out.per_group, lambda p: groups.to_csv(p, index=False))
    # mean and Student-t 95% interval over replicate indices
    summary = over_replicates(cohorts, ["run", "epoch", "split", "group", "cohort"], ["accuracy"])
    write_atomic(out.summary, lambda p: summary.to_csv(p, index=False))
    tables = [out.per_class, out.cohorts, out.per_group, out.summary]
    write_json(out.provenance, table_provenance(run_cfg, snakemake.input.tables, tables))


if __name__ == "__main__":
    run_script(main, "accuracy_tables", globals().get("snakemake"))
