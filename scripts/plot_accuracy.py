"""Rule plot_accuracy: accuracy of each task cohort and of old vs new classes over checkpoints."""

import pandas as pd

from epochlens.plotting.common import plot_accuracy_by_cohort, save_figure
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    cohorts = pd.read_csv(snakemake.input.cohorts)
    fig = plot_accuracy_by_cohort(cohorts, snakemake.params.epochs_per_task, snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


run_step(main, snakemake.log[0])
