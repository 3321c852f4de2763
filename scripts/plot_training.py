"""Rule plot_training: training loss and holdout accuracy per epoch, every replicate index.

By hand, from the run's working directory: python scripts/plot_training.py run=digits
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.accuracy import plot_training_curves
from epochlens.plotting.common import save_figure


def main(snakemake) -> None:
    indices, paths = snakemake.params.indices, snakemake.input.logs
    logs = pd.concat([pd.read_csv(p).assign(index=i) for i, p in zip(indices, paths, strict=True)])
    fig = plot_training_curves(logs, snakemake.params.epochs_per_task, snakemake.wildcards.run)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])


if __name__ == "__main__":
    run_script(main, "plot_training", globals().get("snakemake"))
