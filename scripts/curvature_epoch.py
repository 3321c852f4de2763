"""Rule curvature_epoch: merge one epoch's curvature shards into the per-image files."""

from epochlens.curvature.io import merge_shards
from epochlens.runner import log, run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    out = snakemake.output
    meta = merge_shards(
        snakemake.input.shards, {key: out[key] for key in out.keys()}, snakemake.params.config
    )
    stats = meta["stats"]
    log.info(
        "epoch %d: %d active samples, curvature mean %s, median %s",
        meta["epoch"],
        stats["n_active"],
        stats["curvature_mean"],
        stats["curvature_median"],
    )


run_step(main, snakemake.log[0])
