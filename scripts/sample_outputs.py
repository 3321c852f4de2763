"""Rule sample_outputs: one replicate index's sample-output shards merged into its
``sample_outputs.npz`` (every checkpoint's series over every training and test sample).

By hand, from the run's working directory:
    python scripts/sample_outputs.py run=digits index=0
"""

from _helpers import run_script

from epochlens.runner import log
from epochlens.samples.output_files import merge_outputs


def main(snakemake) -> None:
    shards = snakemake.input.shards
    merge_outputs(shards, snakemake.output.outputs)
    log.info("merged %d shard(s) into %s", len(shards), snakemake.output.outputs)


if __name__ == "__main__":
    run_script(main, "sample_outputs", globals().get("snakemake"))
