"""Rule plot_comparisons: each comparison's runs, one panel per metric: every index's value, each
run's mean and 95% interval, its difference from the baseline.

By hand, from the working directory of finished runs: python scripts/plot_comparisons.py
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.common import save_figure
from epochlens.plotting.comparisons import plot_comparisons


def main(snakemake) -> None:
    table = pd.read_csv(snakemake.input.table, keep_default_na=False, na_values=[""])
    values = pd.read_csv(snakemake.input.values)
    fig = plot_comparisons(table, values)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_comparisons", globals().get("snakemake"))
