"""LoGra's projection of each layer's per-sample gradient (Choe et al. 2024, "What is your data worth
to GPT?"), for the pass of :mod:`.projection`.

A tracked layer's per-sample gradient is G = Σ_t ds_t a_tᵀ (out x in_dim, :mod:`.gradient_math`). Its
projection is P_S G P_Aᵀ = Σ_t (P_S ds_t)(P_A a_t)ᵀ (k_out x k_in), computed from the projected
inputs and output gradients without ever forming G: the cost per position is in_dim·k_in + out·k_out
instead of out·in_dim, and what is kept per sample is k_out·k_in numbers a layer. P_A (k_in x in_dim)
and P_S (k_out x out) are Gaussian with entries N(0, 1/k), so E[PᵀP] = I for P = P_S ⊗ P_A and inner
products are kept in expectation, their error falling as 1/√k (Johnson-Lindenstrauss). A side whose
dimension is at most ``dim`` is not projected (the identity); a layer with both sides at most ``dim``
keeps its whole gradient, so the projected method equals the unprojected one. The projections are a
pure function of (seed, layer name, side): shards, checkpoints and queries draw the same ones.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from epochlens.influence.gradient_math import per_sample_gradient
from epochlens.influence.layers import LayerInfo
from epochlens.influence.projection_settings import ProjectionSettings

F64 = torch.float64


def generator(seed: int, name: str, side: str) -> torch.Generator:
    """The random numbers of a layer's projection: a pure function of (seed, layer name, side)."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}:{side}".encode()) + (seed << 32))


def _gaussian(k: int, d: int, seed: int, name: str, side: str) -> torch.Tensor | None:
    """(k, d) N(0, 1/k) entries drawn from (seed, name, side); None (the identity) where k >= d."""
    if k >= d:
        return None
    return torch.randn(k, d, generator=generator(seed, name, side), dtype=F64) / math.sqrt(k)


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
        return replace(self, out=move(self.out), inp=move(self.inp))

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
