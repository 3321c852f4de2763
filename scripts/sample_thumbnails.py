"""Rule sample_thumbnails: a thumbnail PNG of every training and test image of a run (and of the
test images with a backdoor's trigger), named as the dossier's ``image`` column names them.

By hand, from the run's working directory: python scripts/sample_thumbnails.py run=digits_noisy
"""

from _helpers import run_script

from epochlens.runner import log
from epochlens.samples.thumbnails import write_thumbnails


def main(snakemake) -> None:
    folder = snakemake.output.thumbnails
    count = write_thumbnails(snakemake.input.dataset, folder, snakemake.params.trigger)
    log.info("%d thumbnails in %s%s", count, folder, "" if count else " (the data are not images)")


if __name__ == "__main__":
    run_script(main, "sample_thumbnails", globals().get("snakemake"))
