"""The influence factors of one checkpoint of a run, for the data-quality study: what the
workflow's ``influence_factors`` jobs do, as functions of a :class:`~epochlens.job.CheckpointJob`.

* :func:`fit_checkpoint_factors`: the curvature factors of one method, fitted on the training
  images the checkpoint was trained on, and their per-layer spectrum (:func:`factor_spectrum`);
* sharded (``influence.shards`` > 1: a cluster spreads one checkpoint over several jobs):
  :func:`factor_shard` computes one shard's sums of a pass over the training images (covariances;
  EK-FAC's corrections or the diagonal), :func:`eigenbasis_from_shards` sums the covariance shards
  and eigendecomposes them, :func:`factors_from_shards` finishes the factors from the shards.

The scores are :mod:`epochlens.influence.study_scores` (a separate module, so that editing how
scores are computed does not refit factors).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from epochlens.influence.covariances import CovarianceSums, covariance_sums, resolve_layers
from epochlens.influence.factor_groups import FactorFit, group_settings, plan_groups
from epochlens.influence.factors import (
    CorrectionSums,
    InfluenceFactors,
    apply_corrections,
    correction_sums,
    eigendecompose,
    empty_factors,
    fit_factors,
    report_left_out,
)
from epochlens.influence.gradients import resolve_compute_dtype
from epochlens.influence.io import factor_cache_key, load_factors, load_sums
from epochlens.influence.settings import influence_settings
from epochlens.influence.study_inputs import run_task, shard_rows, trained_samples
from epochlens.job import CheckpointJob
from epochlens.tasks import ClassificationTask

log = logging.getLogger("epochlens")


def factor_spectrum(factors: InfluenceFactors) -> pd.DataFrame:
    """Per layer: the undamped curvature's eigenvalue range and the factor solves (no damping)."""
    rows = []
    for name, lf in factors.layers.items():
        eig = lf.eigenvalues(factors.method).clamp_min(0.0)
        positive = eig[eig > 0]
        rows.append(
            {
                "layer": name,
                "kind": lf.kind,
                "out_dim": lf.out_dim,
                "in_dim": lf.in_dim,
                "n_samples": lf.n_samples,
                "min_eig": float(eig.min()),
                "max_eig": float(eig.max()),
                "mean_eig": float(eig.mean()),
                "zero_eig_share": float((eig == 0).double().mean()),
                "cond_positive": float(positive.max() / positive.min()) if len(positive) else np.nan,
                "activation_min_raw": lf.min_raw.get("A", np.nan),
                "gradient_min_raw": lf.min_raw.get("S", np.nan),
                "solver": "; ".join(f"{k}: {v}" for k, v in lf.solver.items()),
            }
        )
    return pd.DataFrame(rows)


def _setup(job: CheckpointJob, settings: Mapping, execution: Mapping, task_spec):
    """Settings, task, active classes, training samples and the factors' cache key of a job."""
    settings = influence_settings(settings, execution)
    task, active = run_task(task_spec, job.active)
    x, y, trained = trained_samples(job)
    key = factor_cache_key(
        job.model, x, y, active, settings, trained, checkpoint_sha256=job.checkpoint_sha256, task=task
    )
    return settings, task, active, x, y, trained, key


def fit_checkpoint_factors(
    job: CheckpointJob,
    settings: Mapping,
    execution: Mapping,
    progress: bool = False,
    task: str | Mapping | None = None,
) -> FactorFit:
    """The factors of ``settings["method"]`` at the job's checkpoint (timings only in the log) and
    their spectrum, a layer group at a time (:mod:`epochlens.influence.factor_groups`);
    ``execution`` holds the batch sizes and the groups' size (they change no result); ``task`` is
    the run's task (``runs.<run>.task``; None: classification over the checkpoint's classes)."""
    settings, task, active, x, y, trained, key = _setup(job, settings, execution, task)
    names = plan_groups(resolve_layers(job.model, settings), settings.method, settings.factor_memory_gb)
    classes = isinstance(task, ClassificationTask) and task.active is not None
    whom = f"{len(task.active)} active classes" if classes else f"task {task.name}"
    on = f"{len(trained)} images, {whom}, {job.device}, {len(names)} layer group(s) of <="
    log.info("epoch %d %s: fitting on %s %g GiB", job.epoch, settings.method, on, settings.factor_memory_gb)
    spectra: list[pd.DataFrame] = []

    def groups():
        for group in names:
            spec = settings if len(names) == 1 else group_settings(settings, group)
            factors = fit_factors(job.model, x, y, active, spec, trained, job.device, key, progress, task)
            factors, table = _finish(factors)
            spectra.append(table)
            yield factors
            del factors  # written: the next group is fitted without it (one group held at a time)

    return FactorFit(names, key, groups(), spectra)


def _unfitted(job: CheckpointJob, settings, key: dict) -> InfluenceFactors:
    """Empty factors of the job's model, its compute dtype recorded (the sharded passes fill them)."""
    factors = empty_factors(job.model, settings, key)
    factors.compute_dtype = str(resolve_compute_dtype(job.model, settings.compute_dtype)).removeprefix(
        "torch."
    )
    return factors


def _finish(factors: InfluenceFactors) -> tuple[InfluenceFactors, pd.DataFrame]:
    table = factor_spectrum(factors)
    timings = {k: round(v, 2) for k, v in factors.timings.items()}
    fitted = f"{len(table)} layers, {factors.n_samples} samples ({len(factors.skipped)} skipped)"
    log.info(
        "%s, timings %s; largest undamped condition number %.3g",
        fitted,
        timings,
        table["cond_positive"].max(),
    )
    # Timings go to the log, not the file: the same inputs give the same bytes.
    return dataclasses.replace(factors, timings={}), table


def shard_key(factor_key: dict, kind: str, shard: int, nshards: int) -> dict:
    """The cache key of one shard's sums: the factors' key, the pass and the shard."""
    return {"factors": factor_key, "pass": kind, "shard": [int(shard), int(nshards)]}


def factor_shard(
    job: CheckpointJob,
    settings: Mapping,
    execution: Mapping,
    kind: str,
    shard: int,
    nshards: int,
    eigenbasis: str | Path | None = None,
    progress: bool = False,
    task: str | Mapping | None = None,
) -> tuple[CovarianceSums | CorrectionSums, dict]:
    """One shard's sums of a factor pass (``kind``: covariances, or corrections: EK-FAC's in the
    ``eigenbasis`` file, or the diagonal) over its contiguous range of the training images, and
    their key. The shards' sums add up to the unsharded pass's (:func:`factors_from_shards`)."""
    settings, task, active, x, y, trained, key = _setup(job, settings, execution, task)
    rows = shard_rows(len(trained), shard, nshards)
    span = f"{rows[0] if len(rows) else 0}..{rows[-1] if len(rows) else 0} of {len(trained)}"
    where = f"{kind} shard {shard} of {nshards}, training images {span}, {job.device}"
    log.info("epoch %d %s: %s", job.epoch, settings.method, where)
    args = (x[torch.as_tensor(rows, dtype=torch.long)], y[rows], active, settings, trained[rows])
    options = {"device": job.device, "progress": progress, "task": task}
    t0 = time.perf_counter()
    if kind == "covariances":
        sums = covariance_sums(job.model, *args, **options)
    elif kind == "corrections":
        basis = None
        if settings.method == "ekfac":
            if eigenbasis is None:
                raise ValueError("EK-FAC's correction shards need the eigenbasis file")
            basis = load_factors(eigenbasis, expected_key=key)
        sums = correction_sums(job.model, basis, *args, **options)
    else:
        raise ValueError(f"unknown factor pass {kind!r}: covariances or corrections")
    log.info("%d samples in %.1f s", sums.n_valid, time.perf_counter() - t0)
    return sums, shard_key(key, kind, shard, nshards)


def _merged(paths: Sequence[str | Path], key: dict, kind: str) -> CovarianceSums | CorrectionSums:
    n = len(paths)
    parts = [load_sums(p, expected_key=shard_key(key, kind, k, n)) for k, p in enumerate(paths)]
    return type(parts[0]).merged(parts)


def eigenbasis_from_shards(
    job: CheckpointJob,
    settings: Mapping,
    execution: Mapping,
    covariances: Sequence[str | Path],
    task: str | Mapping | None = None,
) -> InfluenceFactors:
    """K-FAC's factors (and EK-FAC's eigenbasis) from the covariance shards, in order."""
    settings, task, active, x, y, trained, key = _setup(job, settings, execution, task)
    sums = _merged(covariances, key, "covariances")
    factors = _unfitted(job, settings, key)
    t0 = time.perf_counter()
    eigendecompose(factors, sums, settings, job.device)
    factors.timings["eigendecomposition"] = time.perf_counter() - t0
    return factors


def factors_from_shards(
    job: CheckpointJob,
    settings: Mapping,
    execution: Mapping,
    covariances: Sequence[str | Path] = (),
    corrections: Sequence[str | Path] = (),
    eigenbasis: str | Path | None = None,
    task: str | Mapping | None = None,
) -> tuple[InfluenceFactors, pd.DataFrame]:
    """The factors of ``settings["method"]`` from its shards, in order, and their spectrum: kfac
    from the ``covariances`` shards; ekfac from the ``eigenbasis`` and the ``corrections`` shards;
    diagonal from the ``corrections`` shards. Equal to :func:`fit_checkpoint_factors` up to the order
    of float64 sums (the shards' are added one after the other)."""
    spec = influence_settings(settings, execution)
    if spec.method == "kfac":
        factors = eigenbasis_from_shards(job, settings, execution, covariances, task)
    else:
        settings_, _, _, _, _, _, key = _setup(job, settings, execution, task)
        if spec.method == "ekfac":
            if eigenbasis is None:
                raise ValueError("EK-FAC's sharded factors need the eigenbasis file")
            factors = load_factors(eigenbasis, expected_key=key)
        else:
            factors = _unfitted(job, settings_, key)
        apply_corrections(factors, _merged(corrections, key, "corrections"))
    return _finish(report_left_out(factors))
