"""The pass of :mod:`.projection` over samples: the model prepared in place, its hooks and the
projections on the compute device; each batch's projected gradients (:meth:`ProjectionPass.rows`)
and the Fisher's sums (:meth:`ProjectionPass.fold_fisher`). Per layer, LoGra's way
(:mod:`.layer_projection`); trak's pass of the whole gradient extends it (:mod:`.whole_projection`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from epochlens.device import model_device
from epochlens.influence.covariances import resolve_layers
from epochlens.influence.gradient_math import per_sample_gradient
from epochlens.influence.gradients import Workspace, resolve_compute_dtype
from epochlens.influence.layer_projection import F64, fisher_sums, layer_projections
from epochlens.influence.layers import LayerInfo
from epochlens.influence.projection_settings import ProjectionSettings
from epochlens.influence.settings import InfluenceSettings


class ProjectionPass:
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
