"""Rule plot_probes: probe scores per layer (heatmaps layer x epoch; past 24 layers, a line per
representation): accuracy, or R² for a regression's ridge probe (each panel names its metric).

By hand, from the run's working directory: python scripts/plot_probes.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.common import save_figure
from epochlens.plotting.probes import plot_probe_accuracy


def main(snakemake) -> None:
    fig = plot_probe_accuracy(pd.read_csv(snakemake.input.summary), snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_probes", globals().get("snakemake"))
