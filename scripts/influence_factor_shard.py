"""Rules influence_covariances and influence_corrections: one shard's sums of a pass over the
training images (a contiguous range of them) for the factors of one checkpoint and method:
covariances (ekfac, kfac), or EK-FAC's eigenvalue corrections in its eigenbasis, or the diagonal.

By hand, from the run's working directory:
    python scripts/influence_factor_shard.py run=digits_noisy index=0 epoch=0075 method=ekfac \
        shard=0 nshards=2 [--rule influence_corrections]
"""

from _helpers import execution, job_files, run_script

from epochlens.influence.io import save_sums
from epochlens.influence.study_factors import factor_shard
from epochlens.job import load_checkpoint_job


def main(snakemake) -> None:
    cfg, wc = snakemake.params.config, snakemake.wildcards
    job = load_checkpoint_job(model=cfg["model"], schedule=cfg["schedule"], **job_files(snakemake))
    eigenbasis = snakemake.input.get("eigenbasis") or []
    sums, key = factor_shard(
        job, cfg["settings"], execution(snakemake, "influence"), snakemake.params.kind,
        int(wc.shard), int(wc.nshards), eigenbasis[0] if eigenbasis else None, True, task=cfg["task"],
    )  # fmt: skip
    save_sums(snakemake.output.shard, sums, key)


if __name__ == "__main__":
    run_script(main, "influence_covariances", globals().get("snakemake"))
