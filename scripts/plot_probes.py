"""Rule plot_probes: probe accuracy heatmaps (layer x epoch) per target and representation."""

import pandas as pd

from epochlens.plotting.common import plot_probe_accuracy, save_figure
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    fig = plot_probe_accuracy(pd.read_csv(snakemake.input.summary), snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


run_step(main, snakemake.log[0])
