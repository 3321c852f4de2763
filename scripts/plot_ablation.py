"""Rule plot_ablation: ablation effect heatmaps (unit group x epoch) on old and new classes.

By hand, from the run's working directory: python scripts/plot_ablation.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.ablation import plot_ablation_effect
from epochlens.plotting.common import save_figure


def main(snakemake) -> None:
    fig = plot_ablation_effect(pd.read_csv(snakemake.input.summary), snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_ablation", globals().get("snakemake"))
