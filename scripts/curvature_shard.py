"""Rule curvature_shard: per-image curvature of one contiguous range of training samples."""

import time

import numpy as np

from epochlens.checkpoints import load_into
from epochlens.curvature.distributed import parallel_curvature
from epochlens.curvature.io import shard_range, write_shard
from epochlens.curvature.settings import CurvatureSettings
from epochlens.data import read_dataset
from epochlens.device import resolve_device
from epochlens.models.networks import build_model
from epochlens.provenance import file_sha256
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    p = snakemake.params
    epoch = int(snakemake.wildcards.epoch)
    shard, nshards = int(snakemake.wildcards.shard), int(snakemake.wildcards.nshards)
    data = read_dataset(snakemake.input.dataset)
    active = schedule_from_config(p.schedule, snakemake.input.class_order).active_classes(epoch)
    model = build_model(p.model, data.num_classes, data.train_images.shape[1])
    load_into(model, snakemake.input.checkpoint)
    # How the work is split does not change results: read from the config, not params, so that
    # changing batch_size or processes reruns nothing.
    execution = snakemake.config["runs"][snakemake.wildcards.run]["curvature"]
    settings = CurvatureSettings(**p.settings, batch_size=execution["batch_size"])
    processes = execution["processes"]
    device = resolve_device(snakemake.config["device"])

    n = len(data.train_labels)
    lo, hi = shard_range(n, shard, nshards)
    idx = np.arange(lo, hi)
    log.info(
        "epoch %d shard %d of %d: samples %d..%d, %d active classes, %d process(es) on %s",
        epoch,
        shard,
        nshards,
        lo,
        hi,
        len(active),
        processes,
        device,
    )
    start = time.perf_counter()
    results = parallel_curvature(
        model,
        data.normalized("train", idx),
        data.train_labels[idx],
        idx,
        active,
        settings,
        device,
        processes,
        progress=True,
    )
    elapsed = time.perf_counter() - start
    results.update(labels=data.train_labels[idx], holdout=data.holdout[idx])
    header = {
        "epoch": epoch,
        "allowed_classes": [int(c) for c in active],
        "estimator": settings.estimator_metadata(),
        "n_samples": n,
        "nshards": nshards,
        "device": str(device),
        "compute_time_seconds": elapsed,
        "inputs": {
            "dataset": data.content_hash,
            "class_order": file_sha256(snakemake.input.class_order),
            "checkpoint": file_sha256(snakemake.input.checkpoint),
        },
    }
    write_shard(snakemake.output.shard, lo, hi, results, header)
    log.info("%d samples in %.1f s", hi - lo, elapsed)


run_step(main, snakemake.log[0])
