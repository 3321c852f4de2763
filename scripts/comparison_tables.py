"""Rule comparison_tables: the runs of each comparison (config ``comparisons``) at their checkpoint,
per metric: each run's mean over its indices with a Student-t 95% interval, and its difference from
the baseline (or every earlier run) with Welch's 95% interval and p-value.

By hand, from the working directory of finished runs: python scripts/comparison_tables.py
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.atomic import write_atomic, write_json
from epochlens.compare import check_same_samples, checkpoint_values, comparison_tables
from epochlens.provenance import table_provenance


def main(snakemake) -> None:
    inp, out, plan = snakemake.input, snakemake.output, snakemake.params.comparisons
    # {(table, run): file}: the input lists are in the order of params.sources' runs
    sources = snakemake.params.sources
    files = {(key, run): path for key in sources for run, path in zip(sources[key], inp[key], strict=True)}
    tables = {path: pd.read_csv(path) for key, path in files.items() if key[0] != "dataset"}
    values, samples = {}, {}
    for c in plan:
        datasets = {r["run"]: files[("dataset", r["run"])] for r in c["runs"]}
        samples[c["name"]] = "sha256:" + check_same_samples(c["name"], c["split"], datasets)
        for r in c["runs"]:
            for metric, source in r["sources"].items():
                path = files[(source, r["run"])]
                values[(c["name"], r["run"], metric)] = checkpoint_values(
                    tables[path], source, metric, r["epoch"], c["split"], r["indices"], path
                )
    table, long = comparison_tables(plan, values)
    write_atomic(out.table, lambda p: table.to_csv(p, index=False))
    write_atomic(out.values, lambda p: long.to_csv(p, index=False))
    # the runs' data sets by the fingerprint of the samples compared (they are the same per comparison)
    provenance = {
        **table_provenance({"comparisons": plan}, list(tables), [out.table, out.values]),
        "samples": samples,
    }
    write_json(out.provenance, provenance)


if __name__ == "__main__":
    run_script(main, "comparison_tables", globals().get("snakemake"))
