"""Rule training_data: the run's prepared data set as the {data} .npz of its training command
(epochlens.data.export: inputs as the model sees them, labels or targets as stored).

By hand, from the run's working directory: python scripts/training_data.py run=q001
"""

from _helpers import run_script

from epochlens.data.export import export_npz
from epochlens.runner import log


def main(snakemake) -> None:
    shapes = export_npz(snakemake.input.dataset, snakemake.output.npz)
    log.info("%s: %s", snakemake.output.npz, ", ".join(f"{k} {v}" for k, v in shapes.items()))


if __name__ == "__main__":
    run_script(main, "training_data", globals().get("snakemake"))
