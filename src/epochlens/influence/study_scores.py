"""Influence scores at one checkpoint of a run, for the data-quality study: what the workflow's
``influence_scores`` jobs do, as a function of a :class:`~epochlens.job.CheckpointJob`.

:func:`checkpoint_scores`: self-influence of every training image and influence on the queries
(:mod:`epochlens.study.queries`, one (Q, N) matrix per query transform); for TracIn the sum over
checkpoints (:func:`epochlens.study.poison.accumulate_tracin`); holdout images (not trained on)
get NaN; and the metadata that says what was computed, how and from what.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from epochlens.influence.io import factor_cache_key, load_factors
from epochlens.influence.scores import pairwise_influence, self_influence
from epochlens.job import CheckpointJob
from epochlens.provenance import file_sha256, provenance
from epochlens.study.corruption import transform_queries
from epochlens.study.poison import accumulate_tracin, influence_settings
from epochlens.study.queries import select_queries

log = logging.getLogger("epochlens")


def _trained(job: CheckpointJob):
    """The training images the checkpoint was trained on (outside the holdout): (x, y, positions)."""
    trained = np.flatnonzero(~job.data.holdout)
    return job.data.normalized("train", trained), job.data.train_labels[trained], trained


@dataclasses.dataclass
class CheckpointScores:
    """What :func:`checkpoint_scores` computed: ``arrays`` (the ``scores.npz`` contents),
    ``diagnostics`` (per-layer conditioning) and ``metadata`` (``metadata.json``)."""

    arrays: dict[str, np.ndarray]
    diagnostics: pd.DataFrame
    metadata: dict


def checkpoint_scores(
    job: CheckpointJob,
    method: str,
    params: Mapping,
    execution: Mapping,
    factors_path: str | Path | None = None,
    tracin_checkpoints: Sequence[str | Path] = (),
    progress: bool = False,
) -> CheckpointScores:
    """Self-influence and influence on the queries of one method at the job's checkpoint.

    Args:
        job: the checkpoint job (with its class schedule).
        method: ekfac, kfac, diagonal, identity or tracin.
        params: what the scores depend on (:func:`epochlens.config.influence_score_params`:
            settings, tracin_epochs, corruption, model, schedule); hashed into the provenance.
        execution: the run's influence section (batch sizes).
        factors_path: the fitted factors (methods with factors).
        tracin_checkpoints: TracIn's checkpoints, one per ``params["tracin_epochs"]``.
        progress: progress bars.
    """
    spec, corruption = params["settings"], params["corruption"]
    settings = influence_settings({**spec, "method": "identity" if method == "tracin" else method}, execution)
    data, epoch, active, device = job.data, job.epoch, job.active, job.device
    n = len(data.train_labels)
    x, y, trained = _trained(job)  # holdout images were not trained on: NaN scores
    q = spec["queries"]
    trigger = q["trigger"] if q["trigger"] is not None else corruption["kind"] == "trigger"
    queries = select_queries(
        job.model,
        data,
        active,
        device,
        q["select"],
        q["max_count"],
        q["labels"],
        q["seed"],
        trigger=corruption if trigger else None,
    )
    log.info(
        "epoch %d %s: %d training images, %d queries (%d %s test images%s), transforms %s, %s",
        epoch,
        method,
        len(trained),
        len(queries.labels),
        queries.candidates,
        q["select"],
        " with the trigger" if queries.triggered else "",
        spec["transforms"],
        device,
    )
    query_images = {
        t: transform_queries(queries.images, t, spec["transform_seed"], spec["noise_std"], spec["crop_pad"])
        for t in spec["transforms"]
    }
    inputs = job.input_hashes()
    factors = None
    if factors_path is not None:
        key = factor_cache_key(
            job.model, x, y, active, settings, trained, checkpoint_sha256=inputs["checkpoint"]
        )
        factors = load_factors(factors_path, expected_key=key)
        inputs["factors"] = file_sha256(factors_path)
    # (epoch, model, active classes) per checkpoint: one for every method but TracIn, which sums
    # the gradient dot products of several.
    if method == "tracin":
        paths = dict(zip(params["tracin_epochs"], tracin_checkpoints, strict=True))
        models = [(e, job.build_model(path), job.active_at(e)) for e, path in paths.items()]
        inputs["tracin_checkpoints"] = {str(e): file_sha256(path) for e, path in paths.items()}
    else:
        models = [(epoch, job.model, active)]

    timings = {}
    start = time.perf_counter()
    self_parts, pair_parts, losses, diagnostics = [], {t: [] for t in query_images}, None, None
    skipped = set()
    for e, net, act in models:
        suffix = f"_{e}" if method == "tracin" else ""
        t0 = time.perf_counter()
        s = self_influence(net, factors, x, y, act, settings, trained, device, progress=progress)
        timings["self" + suffix] = time.perf_counter() - t0
        self_parts.append(s.scores)
        skipped.update(s.skipped.tolist())
        diagnostics = s.diagnostics
        if e == epoch:
            losses = s.losses
        for t, images in query_images.items():
            if len(queries.labels) == 0:
                pair_parts[t].append(np.zeros((0, len(trained))))
                continue
            t0 = time.perf_counter()
            pair = pairwise_influence(
                net,
                factors,
                x,
                y,
                images,
                queries.labels,
                act,
                settings,
                trained,
                queries.test_indices,
                device,
                progress=progress,
            )
            timings[f"pairwise_{t}{suffix}"] = time.perf_counter() - t0
            pair_parts[t].append(pair.scores)
    if losses is None:  # TracIn without the influence epoch's own checkpoint
        losses = self_influence(job.model, None, x, y, active, settings, trained, device).losses
    elapsed = time.perf_counter() - start

    def full(values):  # (..., len(trained)) -> (..., N) with NaN for the holdout
        out = np.full((*values.shape[:-1], n), np.nan, dtype=values.dtype)
        out[..., trained] = values
        return out

    arrays = {
        "self_influence": full(accumulate_tracin(self_parts)),
        "loss": full(np.asarray(losses, np.float64)),
        "query_test_indices": queries.test_indices,
        "query_labels": queries.labels,
        "query_true_labels": queries.true_labels,
        "query_predicted": queries.predicted,
        "query_sign": np.float64(queries.sign),
    }
    for t, parts in pair_parts.items():
        arrays[f"pairwise_{t}"] = full(accumulate_tracin(parts)).astype(np.float32)
    finite = np.isfinite(arrays["self_influence"])
    metadata = {
        "epoch": epoch,
        "method": method,
        "allowed_classes": [int(c) for c in active],
        "settings": {**{k: v for k, v in vars(settings).items()}, "method": method},
        "tracin_epochs": params["tracin_epochs"] or None,
        "queries": {
            "n": len(queries.labels),
            "qualified": queries.candidates,
            "select": q["select"],
            "labels": q["labels"],
            "triggered": queries.triggered,
            "max_count": q["max_count"],
        },
        "transforms": list(spec["transforms"]),
        "corruption": corruption,
        "n_train": int(n),
        "n_scored": int(finite.sum()),
        "skipped": sorted(int(i) for i in skipped),
        "device": str(device),
        "compute_time_seconds": elapsed,
        "timings": timings,
        "stats": {
            "self_influence_median": float(np.nanmedian(arrays["self_influence"])) if finite.any() else None,
            "max_cond": float(diagnostics["cond"].max()) if len(diagnostics) else None,
            "damping_steps": int(diagnostics["damping_steps"].sum()) if len(diagnostics) else 0,
        },
        "provenance": provenance(dict(params), inputs),
    }
    log.info("%d scored of %d training images in %.1f s (%s)", finite.sum(), n, elapsed, timings)
    return CheckpointScores(arrays, diagnostics, metadata)
