"""Rule influence_score_shard: self-influence and influence on the queries of one shard of the
training images (a contiguous range of them) at one checkpoint, for one method.

By hand, from the run's working directory:
    python scripts/influence_score_shard.py run=digits_noisy index=0 epoch=0075 method=ekfac \
        shard=0 nshards=2
"""

from _helpers import execution, job_files, run_script

from epochlens.influence.study_scores import score_shard
from epochlens.job import load_checkpoint_job
from epochlens.study.score_queries import score_queries


def main(snakemake) -> None:
    cfg, inp, wc = snakemake.params.config, snakemake.input, snakemake.wildcards
    job = load_checkpoint_job(model=cfg["model"], schedule=cfg["schedule"], **job_files(snakemake))
    shard = score_shard(
        job, wc.method, cfg, execution(snakemake, "influence"),
        factors_path=inp.factors[0] if inp.factors else None,
        tracin_checkpoints=inp.tracin_checkpoints, shard=int(wc.shard), nshards=int(wc.nshards),
        progress=True, queries=score_queries(job, cfg),
    )  # fmt: skip
    shard.save(snakemake.output.shard)


if __name__ == "__main__":
    run_script(main, "influence_score_shard", globals().get("snakemake"))
