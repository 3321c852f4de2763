"""Rule plot_lds: the linear datamodeling score of each influence method (figures/lds.png, .pdf).

By hand, from the run's working directory: python scripts/plot_lds.py run=digits_noisy
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import pandas as pd
from _helpers import run_script

from epochlens.plotting.common import save_figure
from epochlens.plotting.lds import plot_lds


def main(snakemake) -> None:
    inp, out = snakemake.input, snakemake.output
    fig = plot_lds(pd.read_csv(inp.lds), pd.read_csv(inp.queries), snakemake.wildcards.run)
    save_figure(fig, [out.png, out.pdf])


if __name__ == "__main__":
    run_script(main, "plot_lds", globals().get("snakemake"))
