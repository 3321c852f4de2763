"""Rule plot_curvature: curvature by cohort over epochs, its distribution, and vs loss / CSL."""

import pandas as pd

from epochlens.plotting.common import (
    plot_curvature_by_cohort,
    plot_curvature_distribution,
    plot_curvature_vs_loss,
    save_figure,
)
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    inp, out, run = snakemake.input, snakemake.output, snakemake.wildcards.run
    cohorts = pd.read_csv(inp.cohorts)
    figures = {
        "by_cohort": plot_curvature_by_cohort(cohorts, snakemake.params.epochs_per_task, run),
        "distribution": plot_curvature_distribution(pd.read_csv(inp.distribution), run),
        "vs_loss": plot_curvature_vs_loss(pd.read_csv(inp.samples), run),
    }
    for name, fig in figures.items():
        save_figure(fig, [out[f"{name}_png"], out[f"{name}_pdf"]])


run_step(main, snakemake.log[0])
