"""Scores of the projected methods at one checkpoint of a run, for the data-quality study: what the
workflow's ``influence_store_scores`` jobs do, as a function of a :class:`~epochlens.job.CheckpointJob`.

:func:`store_checkpoint_scores` reads the checkpoint's gradient store (:mod:`.study_store`) once to give
the same ``scores.npz``, metadata and diagnostics as the factor methods (:mod:`.study_scores`):
self-influence, losses and the (Q, N) influence on each query transform. A new query set recomputes
only the queries' projected gradients and one read of the store.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from epochlens.errors import InfluenceError
from epochlens.influence.gradient_store import GradientStore, store_scores
from epochlens.influence.projected_basis import ProjectedBasis
from epochlens.influence.projected_curvature import projected_curvature
from epochlens.influence.projection import project_samples
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
    grads = _open_store(store, key, trained_samples(job)[2])
    t0 = time.perf_counter()
    basis = ProjectedBasis.load(curvature_path)
    if (
        basis.key != grads.key
        or basis.layers != grads.infos[0].layers
        or basis.precondition != projection.precondition
    ):
        raise InfluenceError(
            f"{curvature_path}: the projected curvature is of another store or preconditioner "
            f"({basis.precondition}); delete it and compute it again."
        )
    curvature = projected_curvature(basis, settings)
    timings = {"store": sum(i.timings["store"] for i in grads.infos), "curvature": time.perf_counter() - t0}
    selected, blocks = queries.selected, []
    for images in queries.images.values():
        q = np.full((len(selected.labels), grads.width), np.nan)
        if len(q):
            qx, qy = with_labels(images, selected.labels)
            project_samples(
                job.model, qx, qy, q, settings=settings, projection=projection, mode="measurement",
                curvature=False, active_classes=active, sample_indices=selected.test_indices,
                device=job.device, task=task,
            )  # fmt: skip
        blocks.append(curvature.apply(q))
    t1 = time.perf_counter()
    pairwise, self_ = store_scores(
        grads, curvature, np.concatenate(blocks) if blocks else np.zeros((0, grads.width))
    )
    timings["queries"] = t1 - t0 - timings["curvature"]
    timings["scores"] = time.perf_counter() - t1
    arrays = _arrays(grads, pairwise, self_, queries)
    info = _info(job, method, settings, projection, task, active, grads, queries, timings, key["inputs"])
    result = merge_scores([ScoreShard(grads.positions, arrays, curvature.diagnostics, info)], params)
    result.metadata["shards"] = len(grads.infos)
    return result


def _open_store(store, key: dict, trained: np.ndarray) -> GradientStore:
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


def _arrays(grads: GradientStore, pairwise: np.ndarray, self_: np.ndarray, queries: ScoreQueries) -> dict:
    selected, q = queries.selected, len(queries.selected.labels)
    arrays = {
        "self_influence": self_,
        "loss": grads.concatenated("losses"),
        "query_test_indices": selected.test_indices,
        "query_labels": selected.labels,
        "query_true_labels": selected.true_labels,
        "query_predicted": selected.predicted,
        "query_sign": np.float64(selected.sign),
    }
    for k, t in enumerate(queries.images):
        arrays[f"pairwise_{t}"] = pairwise[k * q : (k + 1) * q]
    return arrays


def _info(
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
