"""Projected per-sample gradients: one pass over samples (:func:`project_samples`) gives each one's
projected gradient of the loss (of the task's measurement, for queries) in the rows of an output
array or a store, and the sums of the outer products of the Fisher's projected gradients (the run's
``fisher``) for :mod:`.projected_curvature`. Projected by layer, LoGra's way (logra, tracin_rp:
:mod:`.layer_projection`), or the whole gradient at once, TRAK's (trak: :mod:`.whole_projection`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from epochlens.device import model_device
from epochlens.influence.covariances import data_source, resolve_layers, resolve_task
from epochlens.influence.gradient_math import per_sample_gradient
from epochlens.influence.gradients import (
    Workspace,
    forward_backprop,
    prepared_model,
    resolve_compute_dtype,
    task_batches,
)
from epochlens.influence.layer_projection import F64, fisher_sums, layer_projections
from epochlens.influence.layers import ActivationCapture, LayerInfo
from epochlens.influence.projection_settings import ProjectionSettings
from epochlens.influence.settings import InfluenceSettings
from epochlens.progress import progress_bar


@dataclass
class ProjectedGradients:
    """What :func:`project_samples` gives besides the rows it wrote.

    Attributes:
        usable: (N,) bool, the sample's row holds its projected gradient (False: NaN row).
        losses: (N,) float64 task loss at the sample's targets (NaN where none).
        scales: (N,) float32 the rows' scales (stored row x scale = the projected gradient).
        fisher: the sums of :meth:`_Pass.fold_fisher` over the Fisher's projected gradients: kind
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


class _Pass:
    """The model prepared in place, its hooks and the layers' projections (``make``) on the device."""

    make = staticmethod(layer_projections)

    def __init__(self, model, settings: InfluenceSettings, projection: ProjectionSettings, task, device):
        self.layers = resolve_layers(model, settings)
        self.projections = self.make(self.layers, projection)
        self.model, self.task, self.settings = model, task, settings
        self.device = model_device(model, device)
        self.dtype = resolve_compute_dtype(model, settings.compute_dtype)
        self.on_device = {n: p.to(self.device) for n, p in self.projections.items()}
        self.workspace = Workspace()
        self.width = max((p.offset + p.size for p in self.projections.values()), default=0)

    @classmethod
    def layout(cls, layers: Mapping[str, LayerInfo], projection: ProjectionSettings) -> list:
        """[name, out_dim, in_dim, k_out, k_in, offset] of each block of a row (a store's layers)."""
        return [
            [n, p.out_dim, p.in_dim, p.k_out, p.k_in, p.offset]
            for n, p in cls.make(layers, projection).items()
        ]

    def fisher_sums(self) -> dict[str, dict[str, torch.Tensor]]:
        return fisher_sums(self.projections, self.device)

    def rows(self, bp, ok: torch.Tensor, vector: int = 0) -> torch.Tensor:
        """(B', width) projected gradients of the batch's ``ok`` rows for one backprop vector."""
        out = torch.zeros(int(ok.sum()), self.width, dtype=F64, device=self.device)
        for name, p in self.on_device.items():
            start = 0
            for a, ds in bp.chunks(name, F64, ok, workspace=self.workspace):
                g = p.project(a, ds[vector])
                out[start : start + len(g), p.offset : p.offset + p.size] += g
                start += len(g)
        return out

    def fold_fisher(self, bp, sums: dict[str, dict[str, torch.Tensor]]) -> int:
        """Add, per layer, the batch's usable Fisher gradients' Σ g̃ g̃ᵀ (``gauss_newton``), Σ_t P_A a_t
        (P_A a_t)ᵀ (``activation``) and Σ_t P_S ds_t (P_S ds_t)ᵀ (``gradient``); the samples added."""
        ok = bp.usable
        for name, p in self.on_device.items():
            for a, ds in bp.chunks(name, F64, ok, workspace=self.workspace):
                a = p.input_side(a)
                flat = a.reshape(-1, a.shape[-1])
                sums["activation"][name].addmm_(flat.T, flat)
                for d in ds:
                    d = p.output_side(d)
                    flat = d.reshape(-1, d.shape[-1])
                    sums["gradient"][name].addmm_(flat.T, flat)
                    g = per_sample_gradient(a, d).reshape(len(a), -1)
                    sums["gauss_newton"][name].addmm_(g.T, g)
        return int(ok.sum())


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


def projection_pass(projection: ProjectionSettings) -> type[_Pass]:
    """The pass of ``projection``: each layer's (logra) or the whole gradient's (trak)."""
    if projection.whole:  # imported here: it extends _Pass
        from epochlens.influence.whole_projection import WholePass

        return WholePass
    return _Pass


def _take_batch(p: _Pass, bp, pos: np.ndarray, idx: np.ndarray, result, out, write, dtype: str) -> None:
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
