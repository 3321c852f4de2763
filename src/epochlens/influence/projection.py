"""Projected per-sample gradients: one pass over samples (:func:`project_samples`) gives each one's
projected gradient of the loss (of the task's measurement, for queries) in the rows of an output
array or a store, and the sums of the outer products of the Fisher's projected gradients (the run's
``fisher``) for :mod:`.projected_curvature`, batch by batch through a pass (:mod:`.projection_pass`):
by layer, LoGra's way (logra, tracin_rp: :mod:`.layer_projection`), or the whole gradient at once,
TRAK's (trak: :mod:`.whole_projection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from epochlens.influence.covariances import data_source, resolve_task
from epochlens.influence.gradients import forward_backprop, prepared_model, task_batches
from epochlens.influence.layer_projection import F64
from epochlens.influence.layers import ActivationCapture
from epochlens.influence.projection_pass import ProjectionPass
from epochlens.influence.projection_settings import ProjectionSettings
from epochlens.influence.settings import InfluenceSettings
from epochlens.influence.whole_projection import WholePass
from epochlens.progress import progress_bar


@dataclass
class ProjectedGradients:
    """What :func:`project_samples` gives besides the rows it wrote.

    Attributes:
        usable: (N,) bool, the sample's row holds its projected gradient (False: NaN row).
        losses: (N,) float64 task loss at the sample's targets (NaN where none).
        scales: (N,) float32 the rows' scales (stored row x scale = the projected gradient).
        fisher: the sums of :meth:`ProjectionPass.fold_fisher` over the Fisher's projected gradients: kind
            (gauss_newton, activation, gradient) -> layer -> float64 matrix.
        n_fisher: samples in those sums.
        skipped, vanished: global indices left out (NaN/Inf gradients; underflow).
    """

    usable: np.ndarray
    losses: np.ndarray
    scales: np.ndarray
    fisher: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    n_fisher: int = 0
    skipped: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)


def project_samples(
    model: nn.Module,
    images,
    labels=None,
    out: np.ndarray | None = None,
    *,
    settings: InfluenceSettings,
    projection: ProjectionSettings,
    mode: str = "loss",
    curvature: bool = True,
    active_classes: np.ndarray | None = None,
    sample_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    task=None,
    progress: bool = False,
    write=None,
) -> ProjectedGradients:
    """One pass over samples: each one's projected gradient (of the loss at its targets, ``mode``
    loss; of the task's measurement, ``mode`` measurement) and, with ``curvature``, the Fisher's sums
    (``settings.fisher``, drawn per (seed, sample index) as the factors' passes draw them).

    Rows go into ``out`` (N, width) as they are computed, or to ``write(positions, rows (B, width)
    float64 scaled, scales)`` when given (a store written batch by batch: memory does not grow with N).
    NaN rows for samples that cannot be used. Batches of ``settings.train_batch_size``.
    """
    task = resolve_task(task, active_classes)
    source = data_source(images, labels, sample_indices, task, "project_samples")
    p = projection_pass(projection)(model, settings, projection, task, device)
    n = len(source)
    result = ProjectedGradients(np.zeros(n, bool), np.full(n, np.nan), np.ones(n, np.float32))
    if curvature:
        result.fisher = p.fisher_sums()
    bar = progress_bar(total=n, unit="sample", disable=not progress, desc=f"projected {mode}", leave=False)
    with prepared_model(model, p.layers, p.device, p.dtype) as net, ActivationCapture(p.layers) as capture:
        for pos, inputs, targets in task_batches(source, task, settings.train_batch_size, p.device, p.dtype):
            idx = source.indices[pos]
            bp = forward_backprop(net, capture, task, inputs, targets, mode, 0, idx)
            _take_batch(p, bp, pos, idx, result, out, write, projection.dtype)
            if curvature:
                fisher = forward_backprop(
                    net, capture, task, inputs, targets, settings.fisher, settings.seed, idx
                )
                result.n_fisher += p.fold_fisher(fisher, result.fisher)
            bar.update(len(pos))
    bar.close()
    result.fisher = {kind: {k: v.cpu() for k, v in sums.items()} for kind, sums in result.fisher.items()}
    return result


def projection_pass(projection: ProjectionSettings) -> type[ProjectionPass]:
    """The pass of ``projection``: each layer's (logra) or the whole gradient's (trak)."""
    return WholePass if projection.whole else ProjectionPass


def _take_batch(
    p: ProjectionPass, bp, pos: np.ndarray, idx: np.ndarray, result, out, write, dtype: str
) -> None:
    """Write one batch's projected gradients (NaN rows where unusable) and note its losses."""
    ok = bp.usable
    ok_np = ok.cpu().numpy()
    rows = torch.full((len(pos), p.width), torch.nan, dtype=F64)
    rows[torch.as_tensor(ok_np)] = p.rows(bp, ok).cpu()
    finite = torch.isfinite(rows).all(1).numpy() & ok_np
    rows[torch.as_tensor(~finite)] = torch.nan
    scales = np.ones(len(pos), np.float32)
    if dtype == "float16":  # each row scaled to a largest magnitude of 1: no overflow, no underflow
        peak = rows.abs().amax(1).numpy()
        scales = np.where(finite & (peak > 0), peak, 1.0).astype(np.float32)
        rows = rows / torch.as_tensor(scales, dtype=F64)[:, None]
    result.usable[pos], result.scales[pos] = finite, scales
    result.losses[pos] = bp.losses.cpu().numpy()
    result.skipped += idx[~bp.valid.cpu().numpy() | (ok_np & ~finite)].tolist()
    result.vanished += idx[bp.vanished.cpu().numpy()].tolist()
    if write is not None:
        write(pos, rows.numpy(), scales)
    elif out is not None:
        out[pos] = rows.numpy() * scales[:, None]
