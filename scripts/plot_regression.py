"""Rule plot_regression: a regression run's test and holdout MSE and R² over checkpoints (and of
each data group, for data with groups).

By hand, from the run's working directory: python scripts/plot_regression.py run=inverse
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.common import save_figure
from epochlens.plotting.regression import plot_regression_metrics


def main(snakemake) -> None:
    metrics = pd.read_csv(snakemake.input.metrics, keep_default_na=False, na_values=[""])
    fig = plot_regression_metrics(metrics, snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_regression", globals().get("snakemake"))
