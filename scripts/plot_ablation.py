"""Rule plot_ablation: ablation effect heatmaps (unit group x epoch) on old and new classes; for a
transformer, layer x head per data group.

By hand, from the run's working directory: python scripts/plot_ablation.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.ablation import plot_ablation_effect, plot_head_ablation
from epochlens.plotting.common import save_figure


def main(snakemake) -> None:
    summary, run = pd.read_csv(snakemake.input.summary), snakemake.wildcards.run
    heads = summary["group"].astype(str).str.startswith("head ").any()
    if heads:
        fig = plot_head_ablation(summary, run)
    elif "delta_accuracy_mean" in summary:
        fig = plot_ablation_effect(summary, run)
    else:  # a regression: its loss is the squared error
        fig = plot_ablation_effect(summary, run, "delta_loss", loss_unit="squared error")
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_ablation", globals().get("snakemake"))
