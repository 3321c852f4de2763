"""TracIn from projected gradient stores (``tracin_rp``: Pruthi et al. 2020's TracInRP with LoGra's
projection of each layer): Σ_e ⟨P g_q(θ_e), P g_n(θ_e)⟩ over the checkpoints of ``tracin_epochs``,
each term from that checkpoint's store (written by the store's shard jobs, as ``logra``'s, once)
and the queries' projected gradients at it; no curvature. What the workflow's
``influence_store_scores`` jobs of ``tracin_rp`` do, as a function of the influence epoch's
:class:`~epochlens.job.CheckpointJob`.

A training sample counts at the checkpoints whose store holds it (its class trained there), a query
at those where its label is (the sum of :func:`~epochlens.influence.accumulate.accumulate_tracin`,
one checkpoint at a time), as in the exact ``tracin``. With projections that are the identity
(``dim`` at least every layer's sides) the scores are ``tracin``'s. The queries are those of the
influence epoch; losses those of the last TracIn checkpoint's store.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from epochlens.errors import InfluenceError
from epochlens.influence.gradient_store import GradientStore
from epochlens.influence.precondition import DIAGNOSTIC_COLUMNS
from epochlens.influence.projected_curvature import ProjectedCurvature
from epochlens.influence.store_summary import PAIRWISE_GB, summarised
from epochlens.influence.study_inputs import trained_samples
from epochlens.influence.study_scores import CheckpointScores, ScoreQueries, ScoreShard, merge_scores
from epochlens.influence.study_store import store_setup
from epochlens.influence.study_store_scores import (
    open_store,
    query_gradients,
    store_arrays,
    store_info,
    whole_scores,
)
from epochlens.job import CheckpointJob

Store = Sequence[tuple[str | Path, str | Path]]


def store_tracin_scores(
    job: CheckpointJob,
    params: Mapping,
    execution: Mapping,
    stores: Mapping[int, Store],
    checkpoints: Mapping[int, str | Path],
    *,
    queries: ScoreQueries,
) -> CheckpointScores:
    """Self-influence Σ_e ‖P g_n(θ_e)‖² and influence on each query transform, (Q, N), summed over
    the checkpoints of ``stores`` (epoch -> its store's shards, (gradients .npy, info .pt) in
    order; ``checkpoints``: epoch -> checkpoint file), at the influence epoch of ``job``."""
    _check_size(job, params, queries)
    positions = trained_samples(job)[2]
    self_sum, pair_sums, last, timings = _Sum(), {t: _Sum() for t in queries.images}, None, {"store": 0.0}
    hashes = {}
    for epoch, store in stores.items():
        at = _job_at(job, epoch, checkpoints[epoch])
        t0 = time.perf_counter()
        grads, self_, pairwise = _epoch_scores(at, params, execution, store, queries)
        where = _rows_in(positions, grads.positions, epoch, job.epoch)
        self_sum.add(_spread(self_, where, len(positions)))
        for t, scores in pairwise.items():
            pair_sums[t].add(_spread(scores, where, len(positions)))
        timings[f"epoch_{epoch}"] = time.perf_counter() - t0  # the queries' gradients, one read
        timings["store"] += sum(i.timings["store"] for i in grads.infos)  # its shard jobs'
        last, losses = grads, _spread(grads.concatenated("losses"), where, len(positions))
        hashes[str(epoch)] = at.checkpoint_sha256  # hashed once, as its store's key checked it
    pairwise = {t: total.value() for t, total in pair_sums.items()}
    arrays = {**store_arrays(last, self_sum.value(), pairwise, queries), "loss": losses}
    settings, projection, task, active, key = store_setup(job, params, execution)
    info = store_info(
        job, "tracin_rp", settings, projection, task, active, last, queries, timings, key["inputs"]
    )
    info["tracin_epochs"] = list(stores)
    info["inputs"]["tracin_checkpoints"] = hashes
    result = merge_scores([ScoreShard(positions, arrays, _no_curvature(last).diagnostics, info)], params)
    result.metadata.update(shards=len(last.infos), pairwise="full", tracin_epochs=list(stores))
    return result


def _epoch_scores(job: CheckpointJob, params, execution, store: Store, queries: ScoreQueries):
    """The store of one checkpoint, its samples' squared norms and their dot products with each
    transform's projected query gradients at that checkpoint."""
    settings, projection, task, active, key = store_setup(job, params, execution)
    grads = open_store(store, key, trained_samples(job)[2])
    identity = _no_curvature(grads)
    pre = query_gradients(job, queries, settings, projection, task, active, identity, grads.width)
    return grads, *whole_scores(grads, identity, pre)


def _job_at(job: CheckpointJob, epoch: int, checkpoint: str | Path) -> CheckpointJob:
    """The same replicate and data at another checkpoint (its classes where the run has a schedule)."""
    if epoch == job.epoch:
        return job
    active = job.active_at(epoch) if job.schedule is not None else None
    new = job.schedule.new_classes(epoch) if job.schedule is not None else None
    return dataclasses.replace(job, epoch=epoch, checkpoint=Path(checkpoint), active=active, new=new)


def _no_curvature(grads: GradientStore) -> ProjectedCurvature:
    """Plain dot products over the store's layers (each layer's columns, no inverse), with the
    diagnostics table of the projected methods (one row a layer)."""
    columns, rows = {}, []
    for name, out_dim, in_dim, k_out, k_in, offset in grads.infos[0].layers:
        columns[name] = slice(offset, offset + k_out * k_in)
        row = dict.fromkeys(DIAGNOSTIC_COLUMNS, math.nan)
        row.update(layer=name, kind="projected", out_dim=k_out, in_dim=k_in, cond=1.0, damping=0.0)
        row.update(damping_steps=0, forward_dtype="", note=f"projected from {out_dim} x {in_dim}")
        rows.append(row)
    diagnostics = pd.DataFrame(rows, columns=list(DIAGNOSTIC_COLUMNS))
    return ProjectedCurvature(dict.fromkeys(columns), columns, diagnostics)


class _Sum:
    """accumulate_tracin's sum, checkpoint by checkpoint: each entry summed where finite, NaN where
    it never is; one (Q, N) total held, not one a checkpoint (the same additions, in order)."""

    def __init__(self) -> None:
        self.total: np.ndarray | None = None
        self.seen: np.ndarray | None = None

    def add(self, part: np.ndarray) -> None:
        finite = np.isfinite(part)
        if self.total is None:
            self.total, self.seen = np.zeros(part.shape), np.zeros(part.shape, bool)
        self.total += np.where(finite, part, 0.0)
        self.seen |= finite

    def value(self) -> np.ndarray:
        return np.where(self.seen, self.total, np.nan)


def _rows_in(positions: np.ndarray, stored: np.ndarray, epoch: int, influence_epoch: int) -> np.ndarray:
    """Where a checkpoint's stored samples are among those trained at the influence epoch."""
    where = np.searchsorted(positions, stored)
    if len(stored) and (where.max() >= len(positions) or not np.array_equal(positions[where], stored)):
        raise InfluenceError(
            f"tracin_rp: the store of epoch {epoch} holds samples not trained at the influence epoch "
            f"{influence_epoch}: its classes are not the run's schedule; delete that store and rerun."
        )
    return where


def _spread(values: np.ndarray, where: np.ndarray, n: int) -> np.ndarray:
    """(..., stored rows) -> (..., n trained samples of the influence epoch), NaN where not stored."""
    out = np.full((*values.shape[:-1], n), np.nan)
    out[..., where] = values
    return out


def _check_size(job: CheckpointJob, params: Mapping, queries: ScoreQueries) -> None:
    """tracin_rp keeps its scores whole: refuse where they pass ``pairwise_gb``."""
    q, n, transforms = len(queries.selected.labels), len(job.data.train_labels), len(queries.images)
    gb = params["settings"]["projection"].get("pairwise_gb", PAIRWISE_GB)
    if summarised(q, n, transforms, gb):
        raise InfluenceError(
            f"tracin_rp: the scores of {q} queries x {transforms} transforms x {n} training samples pass "
            f"influence.projection.pairwise_gb ({gb}); tracin_rp keeps them whole: raise pairwise_gb, or "
            "lower influence.queries.max_count (logra summarises scores this large)."
        )
