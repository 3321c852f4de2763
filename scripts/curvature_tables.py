"""Rule curvature_tables: per-sample CSL / learning time and per-cohort (and per data group)
curvature of one run.

By hand, from the run's working directory: python scripts/curvature_tables.py run=digits
"""

from pathlib import Path

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
from _helpers import run_script

from epochlens.atomic import write_atomic, write_json
from epochlens.curvature.dynamics import run_tables
from epochlens.data.labels import read_data_kind, read_labels
from epochlens.formats.trainer_folders import insert_training_epochs
from epochlens.provenance import table_provenance


def main(snakemake) -> None:
    p, inp, out, run = snakemake.params, snakemake.input, snakemake.output, snakemake.wildcards.run
    # metadata.json of each (index, epoch), index-major: the epoch folders to read
    folders = [Path(m).parent for m in inp.metadata]
    groups = read_labels(inp.dataset, "train").group_of_each()  # data groups (None: no group column)
    correct = "learned" if read_data_kind(inp.dataset) == "regression" else "accuracy"
    tables = run_tables(
        run, p.indices, p.epochs, folders, inp.class_orders, p.schedule, p.epochs_per_task, groups, correct
    )
    # A Trainer folder's checkpoints are numbered by step: the epoch each was written at, too.
    insert_training_epochs(tables["cohorts"], snakemake.config["runs"][run]["checkpoints"])
    for key, df in tables.items():
        write_atomic(out[key], lambda path, df=df: df.to_csv(path, index=False))
    inputs = [*inp.arrays, *inp.class_orders]  # not metadata.json: it holds timings
    write_json(
        out.provenance,
        table_provenance(snakemake.config["runs"][run], inputs, [out[key] for key in tables]),
    )


if __name__ == "__main__":
    run_script(main, "curvature_tables", globals().get("snakemake"))
