"""Rule curvature_shard: per-image curvature of one contiguous range of training samples.

By hand, from the run's working directory:
    python scripts/curvature_shard.py run=digits index=0 epoch=0030 shard=0 nshards=1
"""

from _helpers import execution, job_files, run_script

from epochlens.curvature.distributed import curvature_shard
from epochlens.curvature.io import write_shard
from epochlens.curvature.settings import CurvatureSettings
from epochlens.job import load_checkpoint_job


def main(snakemake) -> None:
    p, wc = snakemake.params, snakemake.wildcards
    job = load_checkpoint_job(model=p.model, schedule=p.schedule, **job_files(snakemake))
    # How the work is split does not change results: read from the config, not params, so that
    # changing batch_size or processes reruns nothing.
    run = execution(snakemake, "curvature")
    settings = CurvatureSettings(**p.settings, batch_size=run["batch_size"])
    lo, hi, results, header = curvature_shard(
        job, settings, int(wc.shard), int(wc.nshards), run["processes"], progress=True
    )
    write_shard(snakemake.output.shard, lo, hi, results, header)


if __name__ == "__main__":
    run_script(main, "curvature_shard", globals().get("snakemake"))
