"""Rule plot_training: training loss and holdout accuracy per epoch, every replicate index."""

import pandas as pd

from epochlens.plotting.common import plot_training_curves, save_figure
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    logs = pd.concat(
        [
            pd.read_csv(p).assign(index=i)
            for i, p in zip(snakemake.params.indices, snakemake.input.logs, strict=True)
        ]
    )
    fig = plot_training_curves(logs, snakemake.params.epochs_per_task, snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


run_step(main, snakemake.log[0])
