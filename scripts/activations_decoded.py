"""Rule activations_decoded: a parquet snapshot of stored activations decoded once into .npy
layers, which every representation's features job of that snapshot then reads.

By hand, from the run's working directory:
    python scripts/activations_decoded.py run=acts index=0 epoch=0003
"""

from _helpers import run_script

from epochlens.data.text_rows import open_any_dataset
from epochlens.features.stored_decode import decode_parquet
from epochlens.features.stored_settings import StoredFeatureSettings
from epochlens.runner import log


def main(snakemake) -> None:
    settings = StoredFeatureSettings(**snakemake.params.settings)
    data = open_any_dataset(snakemake.input.dataset)
    counts = {split: len(data.labels(split)) for split in settings.splits}
    done = decode_parquet(
        snakemake.input.snapshot, snakemake.output.folder, counts, settings, threads=snakemake.threads
    )
    log.info(
        "epoch %s: decoded %d layers of %s into %s (%.2f GB) in %.1f s with %d threads",
        snakemake.wildcards.epoch,
        len(done.layers),
        snakemake.input.snapshot,
        snakemake.output.folder,
        done.nbytes / 1e9,
        done.seconds,
        snakemake.threads,
    )


if __name__ == "__main__":
    run_script(main, "activations_decoded", globals().get("snakemake"))
