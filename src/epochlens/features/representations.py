"""Per-sample representations of one layer's activation, computed batch by batch.

An activation is a tensor (B, C, *spatial) for convolutional layers (usually (B, C, H, W)) or
(B, D) for fully connected ones. Every representation maps it to a matrix (B, dim):

* ``pooled``: global average over the spatial positions, (B, C); a (B, D) activation is kept as is.
* ``stats``: simple statistics of each sample's whole activation, (B, 6), in the order of
  :data:`STATS_COLUMNS`: mean, standard deviation (population), minimum, maximum, root mean square
  and the fraction of positive entries (the share of active ReLUs after a ReLU). One pass each for
  the mean, minimum and maximum; the centred sum of squares (two-pass: no cancellation, whatever
  the mean) and the positive count share one temporary per chunk of samples; rms = sqrt(variance +
  mean²). In float32 they agree with numpy's definitions in float64 to 1e-6 relative.
* ``spectral``: the top-k singular values of each sample's C x (H*W) matrix (channels by spatial
  positions), in descending order, (B, k). Where the matrix has rank below k (min(C, H*W) < k),
  the missing values are 0. A (B, D) activation is a 1 x D matrix: its one singular value is the
  Euclidean norm, followed by k - 1 zeros.

How ``spectral`` is computed (methods, their accuracy, the GPU path and timings):
:mod:`epochlens.features.spectral`; the scratch memory and CPU threads of both:
:mod:`epochlens.features.workspace`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from epochlens.features.settings import RepresentationSettings
from epochlens.features.spectral import (  # noqa: F401 (moved there; importable here too)
    CPU_DIRECT_SIDE,
    GRAM_MAX_SIDE,
    RITZ_SIDE,
    SUBSPACE_BLOCK,
    SUBSPACE_ITERS,
    SUBSPACE_TOL,
    PendingSpectral,
    as_matrix,
    gram_matrices,
    gram_svdvals,
    gram_topk,
    orthonormal,
    randomized_svdvals,
    resolve,
    sketch_matrix,
    spectral,
    spectral_method_for,
    subspace_ritz,
)
from epochlens.features.workspace import Workspace, sample_chunks, scratch

STATS_COLUMNS = ("mean", "std", "min", "max", "rms", "frac_positive")


def pooled(act: torch.Tensor) -> torch.Tensor:
    """Global average over spatial positions: (B, C, *spatial) -> (B, C); (B, D) unchanged."""
    return act if act.ndim == 2 else act.flatten(2).mean(2)


def simple_stats(act: torch.Tensor, workspace: Workspace | None = None) -> torch.Tensor:
    """(B, 6) statistics of each sample's whole activation, columns :data:`STATS_COLUMNS`.

    One pass each for the mean, minimum and maximum; the centred sum of squares (two-pass, so no
    cancellation) and the count of positive entries share one temporary per chunk of samples (from
    ``workspace`` if given). The root mean square is sqrt(variance + mean²), a sum of non-negative
    terms.
    """
    flat = act.flatten(1)
    n = flat.shape[1]
    mean = flat.mean(1)
    squares, positive = [], []
    for lo, hi in sample_chunks(flat, flat.shape[1] * flat.element_size()):
        x = flat[lo:hi]
        tmp = torch.sub(x, mean[lo:hi, None], out=scratch(workspace, "stats", tuple(x.shape), x, x.dtype))
        squares.append(tmp.square_().sum(1))
        positive.append(torch.gt(x, 0, out=tmp).sum(1))  # 1.0 / 0.0, summed
    var = torch.cat(squares) / n
    return torch.stack(
        [mean, var.sqrt(), flat.amin(1), flat.amax(1), (var + mean.square()).sqrt(), torch.cat(positive) / n],
        dim=1,
    )


def compute(
    act: torch.Tensor,
    settings: RepresentationSettings,
    deferred: bool | None = None,
    workspace: Workspace | None = None,
) -> dict[str, torch.Tensor | PendingSpectral]:
    """Every representation in ``settings.names`` of a batch activation, each (B, dim), same device.

    ``deferred`` (default: on a CUDA device) leaves ``spectral`` as a :class:`PendingSpectral`:
    pass the representations of every layer of the batch to :func:`finish` after the forward pass.
    ``workspace``: scratch buffers reused from call to call (:class:`Workspace`).
    """
    act = act.detach()
    if not act.is_floating_point():
        raise ValueError(f"activation must be a floating-point tensor, got {act.dtype}")
    if deferred is None:
        deferred = act.device.type == "cuda"
    out: dict[str, torch.Tensor | PendingSpectral] = {}
    for name in settings.names:
        if name == "pooled":
            out[name] = pooled(act)
        elif name == "stats":
            out[name] = simple_stats(
                act if act.dtype in (torch.float32, torch.float64) else act.float(), workspace
            )
        else:
            out[name] = spectral(act, settings, deferred, workspace)
    return out


def finish(
    out: Mapping[str, Mapping[str, torch.Tensor | PendingSpectral]],
) -> dict[str, dict[str, torch.Tensor]]:
    """``out[layer][representation]`` with every :class:`PendingSpectral` of the batch solved at
    once (:func:`resolve`): on a GPU, the batch's one wait for the device, which copying its
    features to the host needs anyway."""
    result = {layer: dict(reps) for layer, reps in out.items()}
    where = [(layer, r) for layer, reps in result.items() for r, v in reps.items() if _is_pending(v)]
    if where:
        solved = resolve([result[layer][r] for layer, r in where])  # type: ignore[misc]
        for (layer, r), values in zip(where, solved, strict=True):
            result[layer][r] = values
    return result  # type: ignore[return-value]


def dims(shape: tuple[int, ...], settings: RepresentationSettings) -> dict[str, int]:
    """Width of each representation for one sample's activation shape (C, *spatial) or (D,)."""
    widths = {"pooled": shape[0], "stats": len(STATS_COLUMNS), "spectral": settings.spectral_k}
    return {name: widths[name] for name in settings.names}


def _is_pending(value: object) -> bool:
    return isinstance(value, PendingSpectral)
