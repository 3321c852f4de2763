"""Rule influence_store_shard: the projected loss gradients of one shard of the training images (a
contiguous range of them) at one checkpoint, written to the method's gradient store, with the sums
of its projected Gauss-Newton matrices.

By hand, from the run's working directory:
    python scripts/influence_store_shard.py run=digits_noisy index=0 epoch=0075 method=logra \
        shard=0 nshards=1
"""

from _helpers import execution, job_files, run_script

from epochlens.influence.study_store import store_shard
from epochlens.job import load_checkpoint_job


def main(snakemake) -> None:
    cfg, out, wc = snakemake.params.config, snakemake.output, snakemake.wildcards
    job = load_checkpoint_job(model=cfg["model"], schedule=cfg["schedule"], **job_files(snakemake))
    # Batch sizes do not change results: read from the config, not params (changing them reruns nothing).
    store_shard(
        job, cfg, execution(snakemake, "influence"), int(wc.shard), int(wc.nshards),
        out.gradients, out.info, progress=True,
    )  # fmt: skip


if __name__ == "__main__":
    run_script(main, "influence_store_shard", globals().get("snakemake"))
