"""The projected methods' store at one checkpoint of a run: what the workflow's
``influence_store_shard`` jobs do, as a function of a :class:`~epochlens.job.CheckpointJob`.

:func:`store_shard` writes one shard of the training samples' projected gradients and the sums of the
projected curvature (:mod:`.gradient_store`); :mod:`.study_store_scores` scores queries against the
store (:func:`epochlens.influence.projected_basis.store_curvature`: its curvature, once). Nothing
here imports the scoring of the factor methods: editing it reruns no store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from epochlens.influence.covariances import resolve_layers
from epochlens.influence.gradient_store import ShardInfo, StoreWriter
from epochlens.influence.projection import project_samples, projection_pass
from epochlens.influence.projection_settings import projection_settings
from epochlens.influence.settings import influence_settings
from epochlens.influence.study_inputs import run_task, shard_rows, shard_samples, trained_samples
from epochlens.job import CheckpointJob

log = logging.getLogger("epochlens")


def store_setup(job: CheckpointJob, params: Mapping, execution: Mapping):
    """(influence settings, projection settings, task, active classes, the store's key)."""
    spec = params["settings"]
    settings = influence_settings({**spec, "method": "identity"}, execution)
    projection = projection_settings(spec.get("projection"), settings.seed, spec.get("method"))
    task, active = run_task(params.get("task"), job.active)
    key = {
        "projection": projection.store_key(),
        "fisher": settings.fisher,
        "seed": settings.seed,
        "layers": list(settings.layers),
        "exclude_layers": list(settings.exclude_layers),
        "compute_dtype": settings.compute_dtype,
        "task": task.key(),
        "inputs": job.input_hashes(),
    }
    return settings, projection, task, active, key


def store_shard(
    job: CheckpointJob,
    params: Mapping,
    execution: Mapping,
    shard: int,
    nshards: int,
    gradients_path: str | Path,
    info_path: str | Path,
    progress: bool = False,
) -> ShardInfo:
    """Project the loss gradients of shard ``shard`` of ``nshards`` of the trained samples into
    ``gradients_path`` (batch by batch) and write their :class:`ShardInfo` to ``info_path``."""
    settings, projection, task, active, key = store_setup(job, params, execution)
    x_all, y_all, trained_all = trained_samples(job)
    x, y, trained = shard_samples(x_all, y_all, trained_all, shard_rows(len(trained_all), shard, nshards))
    tracked = resolve_layers(job.model, settings)
    layers = projection_pass(projection).layout(tracked, projection)  # [name, out, in, k_out, k_in, offset]
    width = sum(k_out * k_in for *_, k_out, k_in, _ in layers)
    log.info(
        "epoch %d: projected gradients of %d training samples (shard %d of %d), %d layers, %d numbers "
        "a sample (%s), %s",
        job.epoch, len(trained), shard, nshards, len(tracked), width, projection.dtype, job.device,
    )  # fmt: skip
    t0 = time.perf_counter()
    with StoreWriter(gradients_path, len(trained), width, projection.dtype) as writer:
        result = project_samples(
            job.model, x, y, settings=settings, projection=projection, active_classes=active,
            sample_indices=trained, device=job.device, task=task, progress=progress, write=writer,
        )  # fmt: skip
    info = ShardInfo(
        trained.astype(np.int64), result.scales, result.losses, result.usable, layers, result.fisher,
        result.n_fisher, sorted(set(result.skipped)), sorted(set(result.vanished)), key,
        {"store": time.perf_counter() - t0},
    )  # fmt: skip
    info.save(info_path)
    return info
