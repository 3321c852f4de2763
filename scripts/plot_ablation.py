"""Rule plot_ablation: ablation effect heatmaps (unit group x epoch) on old and new classes."""

import pandas as pd

from epochlens.plotting.common import plot_ablation_effect, save_figure
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    fig = plot_ablation_effect(pd.read_csv(snakemake.input.summary), snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


run_step(main, snakemake.log[0])
