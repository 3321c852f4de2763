"""Rule curvature_epoch: merge one epoch's curvature shards into the per-image files.

By hand, from the run's working directory:
    python scripts/curvature_epoch.py run=digits index=0 epoch=0030
"""

from _helpers import run_script

from epochlens.curvature.io import merge_shards
from epochlens.runner import log


def main(snakemake) -> None:
    out = snakemake.output
    outputs = {key: out[key] for key in out.keys()}
    meta = merge_shards(snakemake.input.shards, outputs, snakemake.params.config)
    stats = meta["stats"]
    log.info(
        "epoch %d: %d active samples, curvature mean %s, median %s",
        meta["epoch"],
        stats["n_active"],
        stats["curvature_mean"],
        stats["curvature_median"],
    )


if __name__ == "__main__":
    run_script(main, "curvature_epoch", globals().get("snakemake"))
