"""Rule missing_checkpoint: fails with the path of a checkpoint that a run needs and does not have,
and the fix. Its job stands in for the file (under --keep-going), so that the epochs with their
checkpoints run and each missing one fails alone (epochlens.config.inputs).

By hand, from the run's working directory:
    python scripts/missing_checkpoint.py run=cifar100_lop index=0 epoch=0400
"""

from _helpers import run_script

from epochlens.errors import CheckpointError


def main(snakemake) -> None:
    raise CheckpointError(snakemake.params.error)


if __name__ == "__main__":
    run_script(main, "missing_checkpoint", globals().get("snakemake"))
