"""Rules influence_factors and influence_eigenbasis: the curvature factors of one checkpoint
(ekfac, kfac or diagonal), fitted on the training images it was trained on, and their per-layer
spectrum (before damping). Unsharded (influence.shards: 1) the job makes every pass itself; sharded,
it sums the shards' passes: influence_eigenbasis eigendecomposes EK-FAC's summed covariances,
influence_factors finishes the factors (K-FAC: from the covariance shards; EK-FAC: the eigenbasis
and its correction shards; diagonal: its shards).

By hand, from the run's working directory:
    python scripts/influence_factors.py run=digits_noisy index=0 epoch=0075 method=ekfac
"""

from _helpers import execution, job_files, run_script

from epochlens.atomic import write_atomic
from epochlens.influence.factor_groups import save_factor_groups
from epochlens.influence.io import save_factors
from epochlens.influence.study_factors import (
    eigenbasis_from_shards,
    factors_from_shards,
    fit_checkpoint_factors,
)
from epochlens.job import load_checkpoint_job


def main(snakemake) -> None:
    cfg, inp, out = snakemake.params.config, snakemake.input, snakemake.output
    job = load_checkpoint_job(model=cfg["model"], schedule=cfg["schedule"], **job_files(snakemake))
    # Batch sizes do not change results: read from the config, not params (changing them reruns nothing).
    args = (job, cfg["settings"], execution(snakemake, "influence"))
    if "eigenbasis" in out.keys():  # rule influence_eigenbasis
        save_factors(out.eigenbasis, eigenbasis_from_shards(*args, inp.covariances, task=cfg["task"]))
        return
    if inp.covariances or inp.corrections:
        eigenbasis = inp.eigenbasis[0] if inp.eigenbasis else None
        factors, spectrum = factors_from_shards(
            *args, inp.covariances, inp.corrections, eigenbasis, task=cfg["task"]
        )
        save_factors(out.factors, factors)
    else:  # a layer group at a time, each written as it is fitted
        fit = fit_checkpoint_factors(*args, True, task=cfg["task"])
        save_factor_groups(out.factors, fit.groups, fit.names, fit.key)
        spectrum = fit.spectrum()
    write_atomic(out.diagnostics, lambda path: spectrum.to_csv(path, index=False))


if __name__ == "__main__":
    run_script(main, "influence_factors", globals().get("snakemake"))
