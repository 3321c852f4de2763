"""Influence scores at one checkpoint of a run, for the data-quality study: what the workflow's
``influence_scores`` jobs do, as a function of a :class:`~epochlens.job.CheckpointJob`.

:func:`checkpoint_scores`: self-influence of every training image and influence on the queries
(which the study chooses and passes in: :class:`ScoreQueries`, one (Q, N) matrix per query
transform); for TracIn the sum over checkpoints (:func:`epochlens.influence.accumulate.accumulate_tracin`);
holdout images (not trained on) get NaN; and the metadata that says what was computed, how and from what. With
``influence.shards`` > 1 the workflow scores contiguous ranges of the training images in separate
jobs (:func:`score_shard`, :class:`ScoreShard` files) and concatenates them (:func:`merge_scores`):
each training image's scores are computed as in the unsharded job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from epochlens.atomic import write_atomic
from epochlens.errors import InfluenceError
from epochlens.influence.accumulate import accumulate_tracin
from epochlens.influence.factor_groups import scoring_groups
from epochlens.influence.io import factor_cache_key
from epochlens.influence.scores import pairwise_influence, self_influence
from epochlens.influence.settings import InfluenceSettings, influence_settings
from epochlens.influence.study_inputs import run_task, shard_rows, shard_samples, trained_samples, with_labels
from epochlens.job import CheckpointJob
from epochlens.provenance import file_sha256, provenance

log = logging.getLogger("epochlens")


@dataclasses.dataclass
class CheckpointScores:
    """What :func:`merge_scores` gives: ``arrays`` (the ``scores.npz`` contents),
    ``diagnostics`` (per-layer conditioning) and ``metadata`` (``metadata.json``)."""

    arrays: dict[str, np.ndarray]
    diagnostics: pd.DataFrame
    metadata: dict


@dataclasses.dataclass
class ScoreShard:
    """The scores of one shard of the training images (:func:`score_shard`), or of all of them.

    Attributes:
        positions: (n,) int64 positions in the training split of the scored images, in order.
        arrays: ``self_influence``, ``loss`` (n,) and ``pairwise_{transform}`` (Q, n), float64,
            plus the queries (``query_*``, the same in every shard).
        diagnostics: per-layer conditioning (the same in every shard: it depends on the factors).
        info: JSON-able: n_train, skipped, timings, compute_time_seconds and what the metadata says
            of the queries, settings and inputs (:func:`merge_scores`).
    """

    positions: np.ndarray
    arrays: dict[str, np.ndarray]
    diagnostics: pd.DataFrame
    info: dict

    def save(self, path: str | Path) -> None:
        """Write the shard atomically as one ``.npz`` (diagnostics and info as JSON strings)."""
        info = json.dumps({**self.info, "diagnostics": self.diagnostics.to_dict(orient="list")})
        payload = {"positions": self.positions, **self.arrays, "info": np.array(info)}

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, **payload)

        write_atomic(path, write)

    @classmethod
    def load(cls, path: str | Path) -> ScoreShard:
        """Read a shard written by :meth:`save`.

        Raises:
            InfluenceError: an unreadable file (naming it, and the fix).
        """
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            info = json.loads(str(arrays.pop("info")))
        except Exception as exc:
            raise InfluenceError(
                f"{path}: not a readable influence score shard ({type(exc).__name__}: {str(exc)[:200]}). "
                "Delete it and compute the shard again."
            ) from exc
        diagnostics = pd.DataFrame(info.pop("diagnostics"))
        return cls(arrays.pop("positions"), arrays, diagnostics, info)


@dataclasses.dataclass
class ScoreQueries:
    """The queries whose influence a score job computes, as the study chose them
    (:func:`epochlens.study.score_queries.score_queries`; the engine knows nothing of studies).

    Attributes:
        selected: the chosen queries (a :class:`~epochlens.study.queries.QuerySet`: test_indices,
            labels, true_labels, predicted, sign, candidates, triggered).
        images: per query transform, the queries' inputs under it.
        select, labels, max_count: the study's query settings, for the metadata.
    """

    selected: Any
    images: dict[str, Any]
    select: str
    labels: str
    max_count: int


def checkpoint_scores(
    job: CheckpointJob,
    method: str,
    params: Mapping,
    execution: Mapping,
    factors_path: str | Path | None = None,
    tracin_checkpoints: Sequence[str | Path] = (),
    progress: bool = False,
    *,
    queries: ScoreQueries,
) -> CheckpointScores:
    """Self-influence and influence on the queries of one method at the job's checkpoint, for
    every training image: :func:`score_shard` of the whole training set, then :func:`merge_scores`."""
    shard = score_shard(
        job, method, params, execution, factors_path, tracin_checkpoints, 0, 1, progress, queries=queries
    )
    return merge_scores([shard], params)


@dataclasses.dataclass
class _ShardSamples:
    """The training samples a shard scores, with the task and settings of the checkpoint."""

    settings: InfluenceSettings
    task: Any
    active: np.ndarray | None
    x_all: Any  # every trained sample: the factors' cache key is of them
    y_all: np.ndarray | None
    trained_all: np.ndarray
    x: Any  # the shard's
    y: np.ndarray | None
    trained: np.ndarray


def score_shard(
    job: CheckpointJob,
    method: str,
    params: Mapping,
    execution: Mapping,
    factors_path: str | Path | None = None,
    tracin_checkpoints: Sequence[str | Path] = (),
    shard: int = 0,
    nshards: int = 1,
    progress: bool = False,
    *,
    queries: ScoreQueries,
) -> ScoreShard:
    """Self-influence and influence on the queries of one method at the job's checkpoint, for the
    training images of shard ``shard`` of ``nshards`` (a contiguous range; every shard selects
    and preconditions the same queries).

    Args:
        job: the checkpoint job (with its class schedule).
        method: ekfac, kfac, diagonal, identity or tracin.
        params: what the scores depend on (:func:`epochlens.config.influence_score_params`:
            settings, tracin_epochs, corruption, model, schedule, task); hashed into the provenance.
        execution: the run's influence section (batch sizes, query memory).
        factors_path: the fitted factors (methods with factors).
        tracin_checkpoints: TracIn's checkpoints, one per ``params["tracin_epochs"]``.
        shard, nshards: which contiguous range of the training images to score.
        progress: progress bars.
        queries: the queries and their transformed inputs (the study's
            :func:`~epochlens.study.score_queries.score_queries`).
    """
    samples = _shard_samples(job, method, params, execution, shard, nshards)
    _log_shard(job, method, params, samples, queries, shard, nshards)
    inputs = job.input_hashes()
    groups = _checkpoint_factors(job, samples, factors_path, inputs)
    models = _checkpoint_models(job, method, params, tracin_checkpoints, samples, inputs)
    start = time.perf_counter()
    scored = _score_models(job, method, models, groups, samples, queries, progress)
    elapsed = time.perf_counter() - start
    arrays = _shard_arrays(scored, queries)
    info = {
        "epoch": job.epoch,
        "method": method,
        "allowed_classes": [int(c) for c in job.active] if job.active is not None else None,
        "task": samples.task.key(),
        "settings": {**{k: v for k, v in vars(samples.settings).items()}, "method": method},
        "queries": {
            "n": len(queries.selected.labels),
            "qualified": queries.selected.candidates,
            "select": queries.select,
            "labels": queries.labels,
            "triggered": queries.selected.triggered,
            "max_count": queries.max_count,
        },
        "n_train": int(len(job.data.train_labels)),
        "shard": [int(shard), int(nshards)],
        "skipped": sorted(int(i) for i in scored.skipped),
        "device": str(job.device),
        "compute_time_seconds": elapsed,
        "timings": scored.timings,
        "inputs": inputs,
    }
    return ScoreShard(samples.trained.astype(np.int64), arrays, scored.diagnostics, info)


def _shard_samples(
    job: CheckpointJob, method: str, params: Mapping, execution: Mapping, shard: int, nshards: int
) -> _ShardSamples:
    """The settings (method ``identity`` for TracIn), the task and the trained samples of the shard
    (holdout images were not trained on: they get NaN scores)."""
    spec = params["settings"]
    settings = influence_settings({**spec, "method": "identity" if method == "tracin" else method}, execution)
    task, active = run_task(params.get("task"), job.active)
    x_all, y_all, trained_all = trained_samples(job)
    rows = shard_rows(len(trained_all), shard, nshards)
    x, y, trained = shard_samples(x_all, y_all, trained_all, rows)
    return _ShardSamples(settings, task, active, x_all, y_all, trained_all, x, y, trained)


def _log_shard(job, method, params, samples: _ShardSamples, queries: ScoreQueries, shard, nshards) -> None:
    spec = params["settings"]
    log.info(
        "epoch %d %s: %d training images (shard %d of %d: %d), %d queries (%d %s test images%s), "
        "transforms %s, %s",
        job.epoch,
        method,
        len(samples.trained_all),
        shard,
        nshards,
        len(samples.trained),
        len(queries.selected.labels),
        queries.selected.candidates,
        queries.select,
        " with the trigger" if queries.selected.triggered else "",
        spec["transforms"],
        job.device,
    )


def _checkpoint_factors(job: CheckpointJob, samples: _ShardSamples, factors_path, inputs: dict):
    """A function giving each layer group's factors and settings in turn, checked against the key of
    the trained samples (the file's hash into ``inputs``); one group of none for methods without."""
    if factors_path is None:
        return lambda: iter([(None, samples.settings)])
    s = samples
    key = factor_cache_key(
        job.model, s.x_all, s.y_all, s.active, s.settings, s.trained_all, inputs["checkpoint"], s.task
    )
    inputs["factors"] = file_sha256(factors_path)
    return lambda: scoring_groups(factors_path, samples.settings, key)


def _checkpoint_models(job, method, params, tracin_checkpoints, samples: _ShardSamples, inputs: dict) -> list:
    """(epoch, model, task, active classes) per checkpoint: the job's own for every method but
    TracIn, which sums the gradient dot products of several (their hashes go into ``inputs``)."""
    if method != "tracin":
        return [(job.epoch, job.model, samples.task, samples.active)]
    paths = dict(zip(params["tracin_epochs"], tracin_checkpoints, strict=True))
    models = []
    for e, path in paths.items():
        t, a = run_task(params.get("task"), job.active_at(e))
        models.append((e, job.build_model(path), t, a))
    inputs["tracin_checkpoints"] = {str(e): file_sha256(path) for e, path in paths.items()}
    return models


@dataclasses.dataclass
class _Scored:
    self_parts: list
    pair_parts: dict[str, list]
    losses: Any
    diagnostics: pd.DataFrame | None
    skipped: set
    timings: dict[str, float]


def _score_models(job, method, models, groups, samples: _ShardSamples, queries: ScoreQueries, progress):
    """Self-influence and influence on each transform's queries per checkpoint, over layer groups."""
    s_ = samples
    timings: dict[str, float] = {}
    self_parts, pair_parts, losses = [], {t: [] for t in queries.images}, None
    skipped: set = set()
    for e, net, tk, act in models:
        suffix = f"_{e}" if method == "tracin" else ""
        total, pairs, diagnostics = None, dict.fromkeys(queries.images), []
        for factors, settings in groups():
            g = dataclasses.replace(s_, settings=settings)  # the group's layers tracked
            t0 = time.perf_counter()
            s = self_influence(
                net, factors, s_.x, s_.y, act, settings, s_.trained, job.device, progress=progress, task=tk
            )
            timings["self" + suffix] = timings.get("self" + suffix, 0.0) + time.perf_counter() - t0
            total = s.scores if total is None else total + s.scores
            skipped.update(s.skipped.tolist())
            diagnostics.append(s.diagnostics)
            losses = s.losses if e == job.epoch else losses
            for t, images in queries.images.items():
                pair = _pairwise(
                    net, factors, images, queries, act, tk, g, job, progress, timings, t + suffix
                )
                pairs[t] = pair if pairs[t] is None else pairs[t] + pair
        self_parts.append(total)
        for t in queries.images:
            pair_parts[t].append(pairs[t])
    if losses is None:  # TracIn without the influence epoch's own checkpoint
        losses = self_influence(
            job.model, None, s_.x, s_.y, s_.active, s_.settings, s_.trained, job.device, task=s_.task
        ).losses
    return _Scored(self_parts, pair_parts, losses, pd.concat(diagnostics), skipped, timings)


def _pairwise(
    net, factors, images, queries: ScoreQueries, act, task, s_: _ShardSamples, job, progress, timings, name
):
    """One checkpoint's (Q, n) influence of the shard's samples on the queries under one transform."""
    selected = queries.selected
    if len(selected.labels) == 0:
        return np.zeros((0, len(s_.trained)))
    t0 = time.perf_counter()
    pair = pairwise_influence(
        net,
        factors,
        s_.x,
        s_.y,
        *with_labels(images, selected.labels),
        act,
        s_.settings,
        s_.trained,
        selected.test_indices,
        job.device,
        progress=progress,
        task=task,
        train_total=len(s_.trained_all),  # every shard holds the queries the same way
    )
    timings[f"pairwise_{name}"] = timings.get(f"pairwise_{name}", 0.0) + time.perf_counter() - t0
    return pair.scores


def _shard_arrays(scored: _Scored, queries: ScoreQueries) -> dict[str, np.ndarray]:
    selected = queries.selected
    arrays = {
        "self_influence": accumulate_tracin(scored.self_parts),
        "loss": np.asarray(scored.losses, np.float64),
        "query_test_indices": selected.test_indices,
        "query_labels": selected.labels,
        "query_true_labels": selected.true_labels,
        "query_predicted": selected.predicted,
        "query_sign": np.float64(selected.sign),
    }
    for t, parts in scored.pair_parts.items():
        arrays[f"pairwise_{t}"] = accumulate_tracin(parts)
    return arrays


_QUERY_KEYS = ("query_test_indices", "query_labels", "query_true_labels", "query_predicted", "query_sign")


def merge_scores(shards: Sequence[ScoreShard], params: Mapping) -> CheckpointScores:
    """The checkpoint's scores from its shards (in order): scores concatenated over the training
    images (NaN for the holdout, not trained on), the queries and diagnostics of the first shard
    (the same in all: checked), skipped images and timings of all, and the metadata.

    Raises:
        InfluenceError: shards that disagree on the queries or the training set, or overlap.
    """
    if not shards:
        raise InfluenceError("no score shards to merge")
    first = shards[0]
    n = first.info["n_train"]
    for k, part in enumerate(shards[1:], start=1):
        for key in _QUERY_KEYS:
            if not np.array_equal(part.arrays[key], first.arrays[key]):
                raise InfluenceError(
                    f"score shard {k} selected other queries ({key}) than shard 0: the shards were "
                    "computed from other inputs; delete the shards and compute them again."
                )
        if part.info["n_train"] != n or part.info["method"] != first.info["method"]:
            raise InfluenceError(f"score shard {k} is of another data set or method than shard 0")
    positions = np.concatenate([part.positions for part in shards])
    if len(np.unique(positions)) != len(positions):
        raise InfluenceError("score shards overlap: each training image must be in one shard")

    def full(name: str) -> np.ndarray:  # (..., shard sizes) -> (..., N) with NaN for the holdout
        values = np.concatenate([part.arrays[name] for part in shards], axis=-1)
        out = np.full((*values.shape[:-1], n), np.nan, dtype=np.float64)
        out[..., positions] = values
        return out

    arrays = {"self_influence": full("self_influence"), "loss": full("loss")}
    arrays.update({key: first.arrays[key] for key in _QUERY_KEYS})
    transforms = [k.removeprefix("pairwise_") for k in first.arrays if k.startswith("pairwise_")]
    for t in transforms:
        arrays[f"pairwise_{t}"] = full(f"pairwise_{t}").astype(np.float32)
    timings: dict[str, float] = {}
    for part in shards:
        for key, value in part.info["timings"].items():
            timings[key] = timings.get(key, 0.0) + value
    diagnostics = first.diagnostics
    finite = np.isfinite(arrays["self_influence"])
    info = first.info
    metadata = {
        "epoch": info["epoch"],
        "method": info["method"],
        "allowed_classes": info["allowed_classes"],
        "task": info["task"],
        "settings": info["settings"],
        "tracin_epochs": params["tracin_epochs"] or None,
        "queries": info["queries"],
        "transforms": transforms,
        "corruption": params["corruption"],
        "n_train": int(n),
        "n_scored": int(finite.sum()),
        "shards": len(shards),
        "skipped": sorted({i for part in shards for i in part.info["skipped"]}),
        "device": info["device"],
        "compute_time_seconds": sum(part.info["compute_time_seconds"] for part in shards),
        "timings": timings,
        "stats": {
            "self_influence_median": float(np.nanmedian(arrays["self_influence"])) if finite.any() else None,
            "max_cond": float(diagnostics["cond"].max()) if len(diagnostics) else None,
            "damping_steps": int(diagnostics["damping_steps"].sum()) if len(diagnostics) else 0,
        },
        "provenance": provenance(dict(params), info["inputs"]),
    }
    log.info(
        "%d scored of %d training images in %.1f s (%s)",
        finite.sum(),
        n,
        metadata["compute_time_seconds"],
        timings,
    )
    return CheckpointScores(arrays, diagnostics, metadata)
