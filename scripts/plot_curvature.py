"""Rule plot_curvature: curvature by cohort over epochs, its distribution, and vs loss / CSL.

By hand, from the run's working directory: python scripts/plot_curvature.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.common import save_figure
from epochlens.plotting.curvature import (
    plot_curvature_by_cohort,
    plot_curvature_distribution,
    plot_curvature_vs_loss,
)


def main(snakemake) -> None:
    inp, out, run = snakemake.input, snakemake.output, snakemake.wildcards.run
    cohorts = pd.read_csv(inp.cohorts)
    # One figure at a time (built, saved, closed): the job's peak memory is that of the largest.
    figures = {
        "by_cohort": lambda: plot_curvature_by_cohort(cohorts, snakemake.params.epochs_per_task, run),
        "distribution": lambda: plot_curvature_distribution(pd.read_csv(inp.distribution), run),
        "vs_loss": lambda: plot_curvature_vs_loss(pd.read_csv(inp.samples), run),
    }
    for name, build in figures.items():
        save_figure(build(), [out[f"{name}_png"], out[f"{name}_pdf"]])


if __name__ == "__main__":
    run_script(main, "plot_curvature", globals().get("snakemake"))
