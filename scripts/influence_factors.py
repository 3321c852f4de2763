"""Rule influence_factors: the curvature factors of one checkpoint (ekfac, kfac or diagonal), fitted
on the training images it was trained on, and their per-layer spectrum (before damping).

By hand, from the run's working directory:
    python scripts/influence_factors.py run=digits_noisy index=0 epoch=0075 method=ekfac
"""

from _helpers import execution, job_files, run_script

from epochlens.atomic import write_atomic
from epochlens.influence.io import save_factors
from epochlens.influence.study_factors import fit_checkpoint_factors
from epochlens.job import load_checkpoint_job


def main(snakemake) -> None:
    cfg = snakemake.params.config
    job = load_checkpoint_job(model=cfg["model"], schedule=cfg["schedule"], **job_files(snakemake))
    # Batch sizes do not change results: read from the config, not params (changing them reruns nothing).
    factors, spectrum = fit_checkpoint_factors(job, cfg["settings"], execution(snakemake, "influence"), True)
    save_factors(snakemake.output.factors, factors)
    write_atomic(snakemake.output.diagnostics, lambda path: spectrum.to_csv(path, index=False))


if __name__ == "__main__":
    run_script(main, "influence_factors", globals().get("snakemake"))
