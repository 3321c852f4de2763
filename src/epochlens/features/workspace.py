"""Scratch memory and CPU threads of the representations' arithmetic
(:mod:`epochlens.features.representations`, :mod:`epochlens.features.spectral`): tensors reused
from layer to layer (:class:`Workspace`), samples taken a chunk at a time on the CPU
(:func:`sample_chunks`), and batches of small matrices shared among torch's threads
(:func:`per_matrix`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

#: On the CPU, temporaries of the statistics and float64 copies of the Gram are made for chunks
#: of samples of about this size (MiB), which the allocator reuses (a fresh large block costs
#: its page faults), and never for fewer than :data:`MIN_CHUNK_SAMPLES` samples.
CPU_CHUNK_MIB = 16
MIN_CHUNK_SAMPLES = 8


class Workspace:
    """Scratch tensors that the representations reuse from layer to layer and batch to batch, one
    per role (grown to the largest size asked for). On the CPU a fresh large block costs a page
    fault per 4 KiB on first touch: the temporaries of ``stats`` and of the float64 Gram matrices
    took 33,000 faults per 128 ResNet-18 images (the forward pass itself takes 230,000). Not
    thread-safe: one per extraction (:mod:`epochlens.features.extract` keeps one per run)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(
        self, role: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """An uninitialised tensor of ``shape``, a view of the role's buffer."""
        numel = math.prod(shape)
        key = (role, dtype, torch.device(device))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)


def scratch(
    workspace: Workspace | None, role: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    if workspace is None:
        return like.new_empty(shape, dtype=dtype)
    return workspace.get(role, shape, dtype, like.device)


def sample_chunks(x: torch.Tensor, bytes_per_sample: int) -> list[tuple[int, int]]:
    """(lo, hi) ranges of samples: one for the whole batch off the CPU, else chunks of about
    :data:`CPU_CHUNK_MIB` MiB of ``bytes_per_sample`` (at least :data:`MIN_CHUNK_SAMPLES` samples)."""
    b = len(x)
    rows = b
    if x.device.type == "cpu":
        rows = max(MIN_CHUNK_SAMPLES, (CPU_CHUNK_MIB << 20) // max(bytes_per_sample, 1))
    return [(lo, min(lo + rows, b)) for lo in range(0, b, rows)]


_POOL: dict[int, ThreadPoolExecutor] = {}  # by size


def per_matrix(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn`` (eigvalsh, svdvals, QR) of a batch of small matrices, which torch solves one by one.

    On the CPU, LAPACK runs single-threaded for each matrix (its own threads only slow such small
    problems down: a 128 x 128 eigvalsh took 80 ms for 128 matrices with two threads, 63 ms with
    one) and torch's threads share the batch, in four pieces each, taken in turn, so that a thread
    that another job slows down does not hold the others up (the same values as one call).
    Elsewhere ``fn`` of the whole batch.
    """
    if x.device.type != "cpu":
        return fn(x)
    threads = torch.get_num_threads()
    workers = min(threads, len(x))
    torch.set_num_threads(1)
    try:
        if workers <= 1:
            return fn(x)
        if workers not in _POOL:
            _POOL[workers] = ThreadPoolExecutor(workers, thread_name_prefix="epochlens-linalg")
        return torch.cat(list(_POOL[workers].map(fn, x.chunk(min(4 * workers, len(x))))))
    finally:
        torch.set_num_threads(threads)
