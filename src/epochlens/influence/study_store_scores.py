"""Scores of the projected methods at one checkpoint of a run: what the workflow's
``influence_store_scores`` jobs do for logra (tracin_rp: :mod:`.study_store_tracin`). One read of the
checkpoint's store (:mod:`.study_store`) gives the same ``scores.npz``, metadata and diagnostics as
the factor methods (:mod:`.study_scores`); a new query set recomputes only the queries' projected
gradients. Past ``influence.projection.pairwise_gb`` the file holds the (Q, N) scores' reductions over
the queries and the top-k neighbours both ways instead (:mod:`.store_summary`, two reads).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from epochlens.errors import InfluenceError
from epochlens.influence.gradient_store import GradientStore, store_scores
from epochlens.influence.projected_basis import ProjectedBasis
from epochlens.influence.projected_curvature import ProjectedCurvature, projected_curvature
from epochlens.influence.projection import project_samples
from epochlens.influence.store_summary import PAIRWISE_GB, StoreSummary, store_summary, summarised
from epochlens.influence.study_inputs import trained_samples, with_labels
from epochlens.influence.study_scores import CheckpointScores, ScoreQueries, ScoreShard, merge_scores
from epochlens.influence.study_store import store_setup
from epochlens.job import CheckpointJob


def store_checkpoint_scores(
    job: CheckpointJob,
    method: str,
    params: Mapping,
    execution: Mapping,
    store: Sequence[tuple[str | Path, str | Path]],
    curvature_path: str | Path,
    progress: bool = False,
    *,
    queries: ScoreQueries,
) -> CheckpointScores:
    """Self-influence of every training sample and influence on the queries, from the store's
    shards ((gradients .npy, info .pt) in order), its projected curvature (:func:`store_curvature`)
    and the queries' projected gradients."""
    settings, projection, task, active, key = store_setup(job, params, execution)
    grads = open_store(store, key, trained_samples(job)[2])
    t0 = time.perf_counter()
    curvature = _curvature(curvature_path, grads, projection, settings)
    timings = {"store": sum(i.timings["store"] for i in grads.infos), "curvature": time.perf_counter() - t0}
    pre = query_gradients(job, queries, settings, projection, task, active, curvature, grads.width)
    timings["queries"] = (t1 := time.perf_counter()) - t0 - timings["curvature"]
    n_train, q, summary = len(job.data.train_labels), len(queries.selected.labels), None
    if summarised(q, n_train, len(pre), params["settings"]["projection"].get("pairwise_gb", PAIRWISE_GB)):
        summary = store_summary(grads, curvature, pre, queries.selected.sign)
        arrays = store_arrays(grads, summary.self_influence, {}, queries)
    else:
        arrays = store_arrays(grads, *whole_scores(grads, curvature, pre), queries)
    timings["scores"] = time.perf_counter() - t1
    info = store_info(job, method, settings, projection, task, active, grads, queries, timings, key["inputs"])
    result = merge_scores([ScoreShard(grads.positions, arrays, curvature.diagnostics, info)], params)
    result.metadata.update(shards=len(grads.infos), pairwise="full" if summary is None else "summary")
    if summary is not None:  # no (Q, N) matrix: its reductions and neighbours
        result.arrays.update(summary_arrays(summary, grads.positions, n_train))
        result.metadata["transforms"] = list(pre)
    return result


def _curvature(path, grads: GradientStore, projection, settings) -> ProjectedCurvature:
    """The store's eigendecomposed curvature (:func:`store_curvature`), checked, damped."""
    basis = ProjectedBasis.load(path)
    if (
        basis.key != grads.key
        or basis.layers != grads.infos[0].layers
        or basis.precondition != projection.precondition
    ):
        raise InfluenceError(
            f"{path}: the projected curvature is of another store or preconditioner "
            f"({basis.precondition}); delete it and compute it again."
        )
    return projected_curvature(basis, settings)


def query_gradients(job, queries: ScoreQueries, settings, projection, task, active, curvature, width) -> dict:
    """Per query transform, the queries' preconditioned projected gradients P g̃_q (Q, width)."""
    selected, pre = queries.selected, {}
    for transform, images in queries.images.items():
        q = np.full((len(selected.labels), width), np.nan)
        if len(q):
            qx, qy = with_labels(images, selected.labels)
            project_samples(
                job.model, qx, qy, q, settings=settings, projection=projection, mode="measurement",
                curvature=False, active_classes=active, sample_indices=selected.test_indices,
                device=job.device, task=task,
            )  # fmt: skip
        pre[transform] = curvature.apply(q)
    return pre


def summary_arrays(summary: StoreSummary, positions: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """A :class:`StoreSummary` (in the store's rows) as ``scores.npz`` arrays over the N training
    samples (NaN, -1 for the holdout): ``query_influence_{reduce}_{transform}``, ``proponents`` and
    ``proponent_scores`` (N, k), ``opponents`` ..., ``top_train`` and ``top_train_scores`` (Q, k) of
    training positions, ``bottom_train`` ...."""

    def over_n(values: np.ndarray, fill) -> np.ndarray:
        out = np.full((n, *values.shape[1:]), fill, values.dtype)
        out[positions] = values
        return out

    arrays = {f"query_influence_{key}": over_n(v, np.nan) for key, v in summary.reduced.items()}
    for name, (index, scores) in summary.neighbours.items():
        if name in ("proponents", "opponents"):
            arrays[name], arrays[f"{name[:-1]}_scores"] = over_n(index, -1), over_n(scores, np.nan)
        else:
            arrays[name] = np.where(index >= 0, positions[np.maximum(index, 0)], -1)
            arrays[f"{name}_scores"] = scores
    return arrays


def whole_scores(grads: GradientStore, curvature, pre: dict) -> tuple[np.ndarray, dict]:
    """Self-influence (n,) of the stored samples and, per transform, their (Q, n) influence on the
    queries of ``pre`` (preconditioned projected gradients): one read of the store."""
    stacked = np.concatenate(list(pre.values())) if pre else np.zeros((0, grads.width))
    pairwise, self_ = store_scores(grads, curvature, stacked)
    return self_, dict(zip(pre, np.split(pairwise, len(pre)), strict=True))


def open_store(store, key: dict, trained: np.ndarray) -> GradientStore:
    """The store, checked against the settings and checkpoint of this job and its training samples."""
    grads = GradientStore(store)
    if grads.key != key:
        diff = sorted(k for k in set(key) | set(grads.key) if key.get(k) != grads.key.get(k))
        raise InfluenceError(
            f"{store[0][1]}: the gradient store was written with other {diff} than this job's; its shards "
            "are stale: delete them and compute them again."
        )
    if not np.array_equal(grads.positions, trained):
        raise InfluenceError(f"{store[0][1]}: the store's shards do not cover the trained samples in order")
    return grads


def store_arrays(grads: GradientStore, self_: np.ndarray, pairwise: dict, queries: ScoreQueries) -> dict:
    selected = queries.selected
    arrays = {
        "self_influence": self_,
        "loss": grads.concatenated("losses"),
        "query_test_indices": selected.test_indices,
        "query_labels": selected.labels,
        "query_true_labels": selected.true_labels,
        "query_predicted": selected.predicted,
        "query_sign": np.float64(selected.sign),
    }
    arrays.update({f"pairwise_{t}": scores for t, scores in pairwise.items()})
    return arrays


def store_info(
    job, method, settings, projection, task, active, grads, queries: ScoreQueries, timings, inputs
) -> dict:
    selected = queries.selected
    return {
        "epoch": job.epoch,
        "method": method,
        "allowed_classes": [int(c) for c in job.active] if job.active is not None else None,
        "task": task.key(),
        "settings": {**vars(settings), "method": method, "projection": projection.key()},
        "queries": {
            "n": len(selected.labels),
            "qualified": selected.candidates,
            "select": queries.select,
            "labels": queries.labels,
            "triggered": selected.triggered,
            "max_count": queries.max_count,
        },
        "n_train": int(len(job.data.train_labels)),
        "shard": [0, 1],
        "skipped": sorted({i for info in grads.infos for i in info.skipped}),
        "device": str(job.device),
        "compute_time_seconds": sum(timings.values()),
        "timings": timings,
        "inputs": inputs,
    }
