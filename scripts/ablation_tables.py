"""Rule ablation_tables: the run's ablation table, mean and spread over indices.

By hand, from the run's working directory: python scripts/ablation_tables.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.ablation.summary import ablation_summary
from epochlens.atomic import write_atomic
from epochlens.runner import log


def main(snakemake) -> None:
    rows = pd.concat([pd.read_csv(path) for path in snakemake.input.tables], ignore_index=True)
    summary = ablation_summary(rows)
    write_atomic(snakemake.output.summary, lambda path: summary.to_csv(path, index=False))
    log.info("%d ablation rows -> %d summary rows", len(rows), len(summary))


if __name__ == "__main__":
    run_script(main, "ablation_tables", globals().get("snakemake"))
