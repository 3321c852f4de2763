"""Rule plot_data_map: the data map of a run's dossier (variability x confidence coloured by
correctness, the known corrupted samples marked; a regression's analogue from its absolute error).

By hand, from the run's working directory: python scripts/plot_data_map.py run=digits_noisy
"""

from _helpers import run_script

from epochlens.plotting.common import save_figure
from epochlens.plotting.data_map import corrupted_share_by_region, plot_data_map, read_dossier
from epochlens.runner import log


def main(snakemake) -> None:
    dossier, meta = read_dossier(snakemake.input.dossier)
    regression = meta["task"] == "regression"
    fig = plot_data_map(dossier, snakemake.wildcards.run, len(meta["epochs"]), regression)
    save_figure(fig, [snakemake.output.png, snakemake.output.pdf])
    share = corrupted_share_by_region(dossier)
    if len(share):
        log.info("share of corrupted samples per data-map region:\n%s", share.to_string(index=False))


if __name__ == "__main__":
    run_script(main, "plot_data_map", globals().get("snakemake"))
