"""TRAK's projection (Park et al. 2023, "TRAK: Attributing Model Behavior at Scale") of each sample's
whole gradient, for the pass of :mod:`.projection_pass` (method trak).

The p numbers of a sample's gradient (every tracked layer's G = Σ_t ds_t a_tᵀ, flattened, in layer
order) are mapped to k = ``trak_dim`` by one sparse Johnson-Lindenstrauss transform S (k x p), a
count sketch: coordinate i is added, with a random sign s_i, to one column h(i) of k (Kane and
Nelson's sparse JL with one nonzero a column; the SJLT that GraSS and dattri use for TRAK). E[SᵀS] =
I, so inner products are kept in expectation, with a Gaussian projection's variance less its
diagonal terms, (‖x‖²‖y‖² + ⟨x, y⟩² - 2 Σ_i x_i² y_i²)/k: the error falls as 1/√k. A sample costs
O(p) where the paper's dense Gaussian matrix costs O(pk) and would have to be held (k x p: 90 GB for
ResNet-18 at k = 2,048) or drawn again for every batch. Unlike LoGra's projection
(:mod:`.layer_projection`) the gradient matrices are formed, a chunk of samples at a time
(:func:`~epochlens.influence.gradient_math.gradient_chunks`): T·out·in multiply-adds a layer.

The preconditioner is one k x k block over the whole projected gradient, the store's one "layer"
:data:`WHOLE`: (ΦᵀΦ/n + λI)⁻¹ with Φ the Fisher's projected gradients (the run's ``fisher``;
``empirical`` gives the paper's Φ of the training labels, up to its margin function and 1 - p
weights: here the loss's gradients on both sides, as logra's). With k at least p nothing is projected
(the identity): the scores are exact influence with the whole Gauss-Newton matrix, across layers.
The columns and signs are a pure function of (seed, layer name): shards, checkpoints and queries draw
the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from epochlens.influence.gradient_math import gradient_chunks
from epochlens.influence.layer_projection import F64, generator
from epochlens.influence.layers import LayerInfo
from epochlens.influence.projection_pass import ProjectionPass
from epochlens.influence.projection_settings import ProjectionSettings

#: The name of the store's one block of columns (its "layer" in the store and the diagnostics).
WHOLE = "whole_gradient"


@dataclass
class LayerSketch:
    """One layer's part of S: the column (out·in_dim,) int64 and sign (int8) of each coordinate of
    its flattened gradient, adding into columns [0, size = k); None where nothing is projected (the
    identity: its coordinates are columns [offset, offset + size = out·in_dim))."""

    name: str
    out_dim: int
    in_dim: int
    columns: torch.Tensor | None
    signs: torch.Tensor | None
    offset: int
    size: int

    def to(self, device: torch.device) -> LayerSketch:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, columns=move(self.columns), signs=move(self.signs))

    def project(self, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """(B, size) S_layer vec(G) from a (B, T, in_dim) and ds (B, T, out)."""
        out = torch.empty(len(a), self.size, dtype=a.dtype, device=a.device)
        for part, g in gradient_chunks(a, ds, copies=2):
            flat = g.reshape(len(g), -1)
            if self.columns is None:
                out[part] = flat
            else:
                sketch = torch.zeros(self.size, len(g), dtype=a.dtype, device=a.device)
                out[part] = sketch.index_add_(0, self.columns, (flat * self.signs).T).T
        return out


def _sizes(layers: Mapping[str, LayerInfo], settings: ProjectionSettings) -> tuple[dict[str, int], int]:
    """Each layer's number of gradient coordinates, and a row's width: k (``settings.trak_dim``),
    or p where k >= p (nothing projected)."""
    sizes = {name: info.out_dim * info.in_dim for name, info in layers.items()}
    return sizes, min(settings.trak_dim, sum(sizes.values()))


def layer_sketches(layers: Mapping[str, LayerInfo], settings: ProjectionSettings) -> dict[str, LayerSketch]:
    """Each tracked layer's part of S (k = ``settings.trak_dim``), or of the identity where k >= p."""
    sizes, k = _sizes(layers, settings)
    whole, out, offset = k == sum(sizes.values()), {}, 0
    for name, info in layers.items():
        if whole:
            out[name] = LayerSketch(name, info.out_dim, info.in_dim, None, None, offset, sizes[name])
        else:  # one draw in [0, 2k): the column and the sign
            draw = torch.randint(2 * k, (sizes[name],), generator=generator(settings.seed, name, "whole"))
            signs = (1 - 2 * (draw // k)).to(torch.int8)
            out[name] = LayerSketch(name, info.out_dim, info.in_dim, draw % k, signs, 0, k)
        offset += sizes[name]
    return out


class WholePass(ProjectionPass):
    """The pass of trak: rows S vec(G) of width k (p where not projected), and the Fisher's sums
    Σ φφᵀ of the whole projected gradient (one block, :data:`WHOLE`)."""

    make = staticmethod(layer_sketches)

    @staticmethod
    def layout(layers: Mapping[str, LayerInfo], projection: ProjectionSettings) -> list:
        """One block: [WHOLE, 1, p, 1, k, 0] (k = p where nothing is projected)."""
        sizes, k = _sizes(layers, projection)
        return [[WHOLE, 1, sum(sizes.values()), 1, k, 0]]

    def fisher_sums(self) -> dict[str, dict[str, torch.Tensor]]:
        gauss_newton = torch.zeros(self.width, self.width, dtype=F64, device=self.device)
        return {"gauss_newton": {WHOLE: gauss_newton}, "activation": {}, "gradient": {}}

    def fold_fisher(self, bp, sums: dict[str, dict[str, torch.Tensor]]) -> int:
        """Add Σ φφᵀ of the batch's usable Fisher gradients (each backprop vector's); the samples added."""
        ok = bp.usable
        for vector in range(len(bp.output_grads)):
            rows = self.rows(bp, ok, vector)
            sums["gauss_newton"][WHOLE].addmm_(rows.T, rows)
        return int(ok.sum())
