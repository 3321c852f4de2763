"""Several processes on one node computing per-sample curvature together (torch.distributed).

A curvature shard job may use P processes: rank r takes the r-th contiguous block of the shard's
samples (:func:`epochlens.shards.shard_range`), computes it with
:func:`epochlens.curvature.estimator.per_sample_curvature` and the blocks are gathered on rank 0. Directions
are keyed by global sample index, so the result is the same for any P (tested for P = 1, 2).

Backends: NCCL on CUDA (rank r uses cuda:r), gloo on the CPU (each rank gets an equal share of the
CPU threads). Processes are started with ``torch.multiprocessing.spawn`` and talk over a free
local TCP port; nothing needs to be launched with torchrun.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from epochlens.curvature.estimator import per_sample_curvature, regression_threshold
from epochlens.curvature.settings import CurvatureSettings
from epochlens.data.rows import NormalizedRows
from epochlens.data.text import TextDataset
from epochlens.errors import ConfigError, EpochlensError
from epochlens.outcome import sample_classes
from epochlens.shards import shard_range

if TYPE_CHECKING:
    from epochlens.job import CheckpointJob

log = logging.getLogger("epochlens")


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device of ``rank``: cuda:rank on CUDA, the given device otherwise."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def check_processes(processes: int, device: torch.device) -> None:
    if processes < 1:
        raise ConfigError(f"curvature.processes={processes} must be >= 1. Fix the config.")
    if device.type == "cuda" and processes > torch.cuda.device_count():
        raise ConfigError(
            f"curvature.processes={processes} but only {torch.cuda.device_count()} CUDA devices are "
            "visible: one process per GPU. Lower curvature.processes or request more GPUs."
        )
    if device.type not in ("cpu", "cuda") and processes > 1:
        raise ConfigError(
            f"curvature.processes={processes} on device {device}: several processes need CUDA or "
            "the CPU. Set curvature.processes: 1."
        )


def parallel_curvature(
    model: nn.Module,
    images: torch.Tensor,
    labels: np.ndarray,
    sample_indices: np.ndarray,
    active_classes: np.ndarray,
    settings: CurvatureSettings,
    device: torch.device,
    processes: int = 1,
    progress: bool = False,
    tokens: dict[str, torch.Tensor] | None = None,
    loss_threshold: float | None = None,
) -> dict[str, np.ndarray]:
    """:func:`per_sample_curvature` of N samples split over ``processes`` ranks on this node.

    Same arguments and result as :func:`per_sample_curvature` (the result does not depend on
    ``processes``). With ``processes == 1`` no process is started.
    """
    device = torch.device(device)
    check_processes(processes, device)
    labels, sample_indices = np.asarray(labels), np.asarray(sample_indices)
    if processes == 1 or len(labels) < processes:
        return per_sample_curvature(
            model, images, labels, sample_indices, active_classes, settings, device, progress, tokens,
            loss_threshold,
        )  # fmt: skip
    payload = (
        copy.deepcopy(model).cpu(),
        torch.as_tensor(images if isinstance(images, (torch.Tensor, np.ndarray)) else images[:]),
        labels,
        sample_indices,
        active_classes,
        settings,
        tokens,
        loss_threshold,
    )
    threads = max(1, torch.get_num_threads() // processes)
    # Rank 0 leaves the merged result (or the ranks' errors) in a file: a pipe back to this
    # process would block once its buffer is full, before anyone reads it.
    with tempfile.TemporaryDirectory(prefix="epochlens-ranks-") as tmp, _main_not_reimported():
        mp.spawn(
            _worker,
            args=(processes, free_port(), str(device), threads, payload, tmp, progress),
            nprocs=processes,
            join=True,
        )
        errors = os.path.join(tmp, "errors.json")
        if os.path.exists(errors):
            with open(errors) as f:
                raise EpochlensError(f"curvature with {processes} processes: " + "; ".join(json.load(f)))
        with np.load(os.path.join(tmp, "result.npz")) as z:
            return {key: z[key] for key in z.files}


def curvature_shard(
    job: CheckpointJob,
    settings: CurvatureSettings,
    shard: int,
    nshards: int,
    processes: int = 1,
    progress: bool = False,
) -> tuple[int, int, dict[str, np.ndarray], dict]:
    """Curvature of shard ``shard`` of ``nshards`` (a contiguous range of the training samples) at
    the job's checkpoint: ``(lo, hi, arrays, header)`` for :func:`epochlens.curvature.io.write_shard`.

    The header records what the values depend on (epoch, active classes, estimator, inputs'
    hashes), the device and the compute time. A causal LM's samples (token labels, no class
    schedule) and a regression's (float targets) are all of class 0
    (:func:`epochlens.outcome.sample_classes`), its one active class; a regression's sample is
    correct when its loss is at most :func:`regression_threshold` of the training targets.
    """
    data = job.data
    active = job.active if job.active is not None else np.zeros(1, np.int64)
    n = len(data.train_labels)
    lo, hi = shard_range(n, shard, nshards)
    idx = np.arange(lo, hi)
    log.info(
        "epoch %d shard %d of %d: samples %d..%d, %d active classes, %d process(es) on %s",
        job.epoch, shard, nshards, lo, hi, len(active), processes, job.device,
    )  # fmt: skip
    start = time.perf_counter()
    inputs, tokens = curvature_inputs(job, idx)
    threshold = None
    if data.is_regression:  # on the whole training split, so every shard shares it
        threshold = regression_threshold(data.train_labels, settings.tolerance, settings.reduction)
    results = parallel_curvature(
        job.model, inputs, data.train_labels[idx], idx, active, settings,
        job.device, processes, progress=progress, tokens=tokens, loss_threshold=threshold,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    results.update(labels=sample_classes(data.train_labels[idx]), holdout=data.holdout[idx])
    estimator = settings.estimator_metadata()
    if threshold is not None:
        del estimator["temperature"]
        estimator["gradient"] = (
            f"g(x)=d/dx squared error(f(x), y) ({settings.reduction} over y's values), model in eval mode"
        )
    header = {
        "epoch": job.epoch,
        "allowed_classes": [int(c) for c in active],
        "estimator": estimator,
        **({"regression": regression_header(settings, threshold)} if threshold is not None else {}),
        "n_samples": n,
        "nshards": nshards,
        "device": str(job.device),
        "compute_time_seconds": elapsed,
        "inputs": job.input_hashes(),
    }
    log.info("%d samples in %.1f s", hi - lo, elapsed)
    return lo, hi, results, header


def regression_header(settings: CurvatureSettings, threshold: float) -> dict:
    """A regression's loss and what counts as learned, for the results' metadata."""
    return {
        "loss": f"squared error, {settings.reduction} over a sample's values",
        "tolerance": settings.tolerance,
        "learned_below": threshold,
        "formula_learned": "loss <= tolerance * mean_n loss(mean of the training targets, y_n)",
    }


def curvature_inputs(job: CheckpointJob, idx: np.ndarray) -> tuple[Any, dict[str, torch.Tensor] | None]:
    """What curvature differentiates for the training samples ``idx``, read a batch at a time:
    normalised images (and no tokens), or a text run's input embeddings (the model's token-embedding
    rows of the ids, float32; a text-to-text model's encoder's) with the ids and attention mask."""
    if isinstance(job.data, TextDataset):
        tokens = job.data.inputs("train", idx)  # a text-to-text model's: with its decoder labels
        model = job.model
        if getattr(model.config, "is_encoder_decoder", False):
            model = model.get_encoder()  # the encoder's lookup (T5 shares it with the decoder)
        return InputEmbeddings(model.get_input_embeddings(), tokens["input_ids"]), tokens
    return NormalizedRows(job.data, "train", idx), None


class InputEmbeddings:
    """A text model's input embeddings (N, T, D) of token ids (N, T) as a read-only float32 tensor
    that looks its rows up when indexed (``x[rows]``), so that a shard never holds them all (100,000
    sequences of 128 tokens at D = 768: 39 GB)."""

    def __init__(self, lookup: nn.Module, input_ids: torch.Tensor):
        self.lookup, self.input_ids = lookup, input_ids
        width = self[:1].shape[-1] if len(input_ids) else 0
        self.shape, self.ndim, self.dtype = (*input_ids.shape, width), input_ids.ndim + 1, torch.float32

    def __len__(self) -> int:
        return len(self.input_ids)

    def is_floating_point(self) -> bool:
        return True

    def __getitem__(self, rows) -> torch.Tensor:
        with torch.no_grad():
            return self.lookup(self.input_ids[rows]).float()


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """Keep spawned workers from re-running the caller's main script.

    A spawned process imports the parent's ``__main__`` from its file. For a Snakemake ``script:``
    that file is the user's script without the ``snakemake`` object Snakemake injects, so the import
    fails; the workers need nothing from it (their function and payload live in this library).
    multiprocessing skips the import when ``__main__`` has no ``__file__``.
    """
    main = sys.modules["__main__"]
    path = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path


def _worker(rank, world, port, device, threads, payload, out_dir, progress) -> None:
    """One rank: compute its block, gather on rank 0, which writes the merged result to out_dir."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = rank_device(torch.device(device), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(threads)
    dist.init_process_group(backend_for(device), rank=rank, world_size=world, timeout=timedelta(minutes=30))
    model, images, labels, indices, active, settings, tokens, loss_threshold = payload
    lo, hi = shard_range(len(labels), rank, world)
    try:
        part = per_sample_curvature(
            model,
            images[lo:hi],
            labels[lo:hi],
            indices[lo:hi],
            active,
            settings,
            device,
            progress=progress and rank == 0,
            tokens=None if tokens is None else {k: v[lo:hi] for k, v in tokens.items()},
            loss_threshold=loss_threshold,
        )
        message = ("ok", part)
    except Exception as exc:  # every rank must reach the gather, or rank 0 waits forever
        message = ("error", f"rank {rank}: {exc}")
    gathered = [None] * world
    dist.all_gather_object(gathered, message)
    dist.destroy_process_group()
    if rank != 0:
        return
    errors = [text for status, text in gathered if status != "ok"]
    if errors:
        with open(os.path.join(out_dir, "errors.json"), "w") as f:
            json.dump(errors, f)
        return
    parts = [part for _, part in gathered]
    merged = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    np.savez(os.path.join(out_dir, "result.npz"), **merged)
