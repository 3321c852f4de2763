"""The influence factors of one checkpoint of a run, for the data-quality study: what the
workflow's ``influence_factors`` jobs do, as functions of a :class:`~epochlens.job.CheckpointJob`.

* :func:`fit_checkpoint_factors`: the curvature factors of one method, fitted on the training
  images the checkpoint was trained on, and their per-layer spectrum (:func:`factor_spectrum`).

The scores are :mod:`epochlens.influence.study_scores` (a separate module, so that editing how
scores are computed does not refit factors).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import numpy as np
import pandas as pd

from epochlens.influence.factors import InfluenceFactors, fit_factors
from epochlens.influence.io import factor_cache_key
from epochlens.job import CheckpointJob
from epochlens.study.poison import influence_settings

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


def _trained(job: CheckpointJob):
    """The training images the checkpoint was trained on (outside the holdout): (x, y, positions)."""
    trained = np.flatnonzero(~job.data.holdout)
    return job.data.normalized("train", trained), job.data.train_labels[trained], trained


def fit_checkpoint_factors(
    job: CheckpointJob, settings: Mapping, execution: Mapping, progress: bool = False
) -> tuple[InfluenceFactors, pd.DataFrame]:
    """The factors of ``settings["method"]`` at the job's checkpoint (timings only in the log) and
    their spectrum; ``execution`` holds the batch sizes (they change no result)."""
    settings = influence_settings(settings, execution)
    x, y, trained = _trained(job)
    key = factor_cache_key(
        job.model, x, y, job.active, settings, trained, checkpoint_sha256=job.checkpoint_sha256
    )
    log.info(
        "epoch %d %s: fitting on %d images, %d active classes, %s",
        job.epoch,
        settings.method,
        len(trained),
        len(job.active),
        job.device,
    )
    factors = fit_factors(
        job.model, x, y, job.active, settings, trained, device=job.device, key=key, progress=progress
    )
    table = factor_spectrum(factors)
    log.info(
        "%d layers, %d samples (%d skipped), timings %s; largest undamped condition number %.3g",
        len(table),
        factors.n_samples,
        len(factors.skipped),
        {k: round(v, 2) for k, v in factors.timings.items()},
        table["cond_positive"].max(),
    )
    # Timings go to the log, not the file: the same inputs give the same bytes.
    return dataclasses.replace(factors, timings={}), table
