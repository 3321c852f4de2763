"""Rule plot_accuracy: accuracy of each task cohort and of old vs new classes over checkpoints (and
of each data group, for data with groups).

By hand, from the run's working directory: python scripts/plot_accuracy.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.accuracy import plot_accuracy_by_cohort
from epochlens.plotting.common import save_figure


def main(snakemake) -> None:
    cohorts = pd.read_csv(snakemake.input.cohorts)
    groups = pd.read_csv(snakemake.input.per_group)
    p = snakemake.params
    fig = plot_accuracy_by_cohort(
        cohorts, p.epochs_per_task, snakemake.wildcards.run, groups=groups, metric=p.metric
    )
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_accuracy", globals().get("snakemake"))
