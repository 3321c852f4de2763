"""Projected per-sample gradients, LoGra-style (Choe et al. 2024, "What is your data worth to GPT?").

A tracked layer's per-sample gradient is G = Σ_t ds_t a_tᵀ (out x in_dim, :mod:`.gradient_math`). Its
projection is P_S G P_Aᵀ = Σ_t (P_S ds_t)(P_A a_t)ᵀ (k_out x k_in), computed from the projected
inputs and output gradients without ever forming G: the cost per position is in_dim·k_in + out·k_out
instead of out·in_dim, and what is kept per sample is k_out·k_in numbers a layer. P_A (k_in x in_dim)
and P_S (k_out x out) are Gaussian with entries N(0, 1/k), so E[PᵀP] = I for P = P_S ⊗ P_A and inner
products are kept in expectation, their error falling as 1/√k (Johnson-Lindenstrauss). A side whose
dimension is at most ``dim`` is not projected (the identity: nothing is lost there); a layer with both
sides at most ``dim`` keeps its whole gradient, so the projected method equals the unprojected one.

The projections are a pure function of (seed, layer name, side): every shard, every checkpoint and the
queries draw the same ones. :func:`project_samples` runs one pass over samples: each one's projected
gradient of the loss (of the task's measurement, for queries) into the rows of an output array, and,
for the curvature, the sums of the outer products of the projected gradients of the Fisher's targets
(the run's ``fisher``: drawn from the model by default), which :mod:`.projected_curvature` turns into
each layer's projected Gauss-Newton matrix.
"""

from __future__ import annotations

import math
import zlib
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
from epochlens.influence.layers import ActivationCapture, LayerInfo
from epochlens.influence.projection_settings import ProjectionSettings
from epochlens.influence.settings import InfluenceSettings
from epochlens.progress import progress_bar

F64 = torch.float64


def _gaussian(k: int, d: int, seed: int, name: str, side: str) -> torch.Tensor | None:
    """(k, d) N(0, 1/k) entries drawn from (seed, name, side); None (the identity) where k >= d."""
    if k >= d:
        return None
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}:{side}".encode()) + (seed << 32))
    return torch.randn(k, d, generator=generator, dtype=F64) / math.sqrt(k)


@dataclass
class LayerProjection:
    """One layer's projections: ``out`` (k_out, out) of the output side, ``inp`` (k_in, in_dim) of the
    input side (bias column included); None where the side is kept whole."""

    name: str
    out_dim: int
    in_dim: int
    out: torch.Tensor | None
    inp: torch.Tensor | None
    offset: int = 0  # first column of the layer in a sample's projected gradient

    @property
    def k_out(self) -> int:
        return self.out_dim if self.out is None else self.out.shape[0]

    @property
    def k_in(self) -> int:
        return self.in_dim if self.inp is None else self.inp.shape[0]

    @property
    def size(self) -> int:
        return self.k_out * self.k_in

    def to(self, device: torch.device) -> LayerProjection:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return LayerProjection(
            self.name, self.out_dim, self.in_dim, move(self.out), move(self.inp), self.offset
        )

    def input_side(self, a: torch.Tensor) -> torch.Tensor:
        """P_A a_t at every position: (B, T, k_in) from (B, T, in_dim)."""
        return a if self.inp is None else a @ self.inp.T

    def output_side(self, ds: torch.Tensor) -> torch.Tensor:
        """P_S ds_t at every position: (B, T, k_out) from (B, T, out)."""
        return ds if self.out is None else ds @ self.out.T

    def project(self, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """(B, k_out·k_in) Σ_t (P_S ds_t)(P_A a_t)ᵀ from a (B, T, in_dim) and ds (B, T, out)."""
        return per_sample_gradient(self.input_side(a), self.output_side(ds)).reshape(a.shape[0], -1)


def layer_projections(
    layers: Mapping[str, LayerInfo], settings: ProjectionSettings
) -> dict[str, LayerProjection]:
    """Each tracked layer's projections, with its columns' offset in the concatenated gradient."""
    out, offset = {}, 0
    for name, info in layers.items():
        k_out, k_in = min(settings.dim, info.out_dim), min(settings.dim, info.in_dim)
        p = LayerProjection(
            name,
            info.out_dim,
            info.in_dim,
            _gaussian(k_out, info.out_dim, settings.seed, name, "out"),
            _gaussian(k_in, info.in_dim, settings.seed, name, "in"),
            offset,
        )
        out[name] = p
        offset += p.size
    return out


def fisher_sums(projections: Mapping[str, LayerProjection], device) -> dict[str, dict[str, torch.Tensor]]:
    """Zero sums of the projected curvature: per layer its Gauss-Newton block (size²) and its
    Kronecker factors (k_in², k_out²)."""
    shapes = {"gauss_newton": "size", "activation": "k_in", "gradient": "k_out"}
    return {
        kind: {
            n: torch.zeros(getattr(p, dim), getattr(p, dim), dtype=F64, device=device)
            for n, p in projections.items()
        }
        for kind, dim in shapes.items()
    }


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
    """The model prepared in place, its hooks and the layers' projections on the compute device."""

    def __init__(self, model, settings: InfluenceSettings, projection: ProjectionSettings, task, device):
        self.layers = resolve_layers(model, settings)
        self.projections = layer_projections(self.layers, projection)
        self.model, self.task, self.settings = model, task, settings
        self.device = model_device(model, device)
        self.dtype = resolve_compute_dtype(model, settings.compute_dtype)
        self.on_device = {n: p.to(self.device) for n, p in self.projections.items()}
        self.workspace = Workspace()
        self.width = sum(p.size for p in self.projections.values())

    def rows(self, bp, ok: torch.Tensor, vector: int = 0) -> torch.Tensor:
        """(B', width) projected gradients of the batch's ``ok`` rows for one backprop vector."""
        out = torch.empty(int(ok.sum()), self.width, dtype=F64, device=self.device)
        for name, p in self.on_device.items():
            start = 0
            for a, ds in bp.chunks(name, F64, ok, workspace=self.workspace):
                g = p.project(a, ds[vector])
                out[start : start + len(g), p.offset : p.offset + p.size] = g
                start += len(g)
        return out

    def fold_fisher(self, bp, sums: dict[str, dict[str, torch.Tensor]]) -> int:
        """Add, per layer, the batch's usable Fisher gradients' Σ g̃ g̃ᵀ (``gauss_newton``) and the
        Kronecker factors' Σ_t P_A a_t (P_A a_t)ᵀ (``activation``) and Σ_t P_S ds_t (P_S ds_t)ᵀ
        (``gradient``) to ``sums``; the number of samples."""
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
    loss; of the task's measurement, ``mode`` measurement) and, with ``curvature``, the sums of the
    projected Gauss-Newton matrices from the Fisher's gradients (``settings.fisher``, drawn per
    (seed, sample index) as the factors' passes draw them).

    Rows go into ``out`` (N, width) as they are computed, or to ``write(positions, rows (B, width)
    float64 scaled, scales)`` when given (a store written batch by batch: memory does not grow with N).
    NaN rows for samples that cannot be used. Batches of ``settings.train_batch_size``.
    """
    task = resolve_task(task, active_classes)
    source = data_source(images, labels, sample_indices, task, "project_samples")
    p = _Pass(model, settings, projection, task, device)
    n = len(source)
    result = ProjectedGradients(np.zeros(n, bool), np.full(n, np.nan), np.ones(n, np.float32))
    if curvature:
        result.fisher = fisher_sums(p.projections, p.device)
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
