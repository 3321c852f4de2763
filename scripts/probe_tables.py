"""Rule probe_tables: the run's probe table, mean and spread over probe seeds and indices.

By hand, from the run's working directory: python scripts/probe_tables.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.atomic import write_atomic
from epochlens.probes.summary import probe_summary
from epochlens.runner import log


def main(snakemake) -> None:
    per_seed = pd.concat([pd.read_csv(path) for path in snakemake.input.tables], ignore_index=True)
    summary = probe_summary(per_seed)
    write_atomic(snakemake.output.summary, lambda path: summary.to_csv(path, index=False))
    skipped = summary[summary["status"] != "ok"]
    log.info("%d probe rows -> %d summary rows (%d skipped)", len(per_seed), len(summary), len(skipped))


if __name__ == "__main__":
    run_script(main, "probe_tables", globals().get("snakemake"))
