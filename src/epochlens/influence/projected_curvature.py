"""The curvature of the projected methods: per layer, the projected Gauss-Newton matrix
H̃ = E_n[g̃_n g̃_nᵀ] of the Fisher's projected gradients (:mod:`.projection`), damped and inverted in its
eigenbasis as the factor methods' curvature is (:mod:`.damping`: relative damping λ = damping x mean
eigenvalue by default, the ladder where a solve is not finite; :mod:`.eigen`'s robust solver), and
the same per-layer diagnostics table. With projections that are the identity, H̃ is the layer's exact
(block-diagonal) Gauss-Newton matrix; with ``precondition: none`` there is no curvature (projected
gradient dot products).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from epochlens.errors import NoFiniteSamplesError
from epochlens.influence.damping import condition_number, damping_ladder, initial_damping
from epochlens.influence.eigen import symmetric_eigh
from epochlens.influence.precondition import DIAGNOSTIC_COLUMNS
from epochlens.influence.settings import InfluenceSettings


@dataclass
class ProjectedCurvature:
    """Each layer's damped inverse (size, size) float64 over its columns [offset, offset + size);
    None per layer without preconditioning. ``diagnostics``: one row per layer."""

    inverses: dict[str, np.ndarray | None]
    columns: dict[str, slice]
    diagnostics: pd.DataFrame

    def apply(self, g: np.ndarray) -> np.ndarray:
        """(B, width) preconditioned rows (H̃ + λI)⁻¹ g̃ per layer."""
        out = np.empty_like(g)
        for name, cols in self.columns.items():
            inv = self.inverses[name]
            out[:, cols] = g[:, cols] if inv is None else g[:, cols] @ inv
        return out


def projected_curvature(
    sums: Mapping[str, Mapping[str, torch.Tensor]],
    n_samples: int,
    layers: list,
    settings: InfluenceSettings,
    precondition: str = "gauss_newton",
) -> ProjectedCurvature:
    """Damped inverses of the layers' projected curvature from the Fisher's sums over ``n_samples``
    samples (:func:`epochlens.influence.projection.fisher_sums`; ``layers``: [name, out_dim, in_dim,
    k_out, k_in, offset] in column order): ``ekfac`` (the eigenbasis of the projected Kronecker
    factors, eigenvalues refitted: exactly EK-FAC where nothing is projected), ``gauss_newton``
    (the whole projected block) or ``none``.

    Raises:
        NoFiniteSamplesError: no sample in the sums. DampingError, EigenError.
    """
    if precondition != "none" and n_samples < 1:
        raise NoFiniteSamplesError(
            "no training sample has finite projected Fisher gradients: the projected curvature is empty"
        )
    inverses, columns, rows = {}, {}, []
    for name, out_dim, in_dim, k_out, k_in, offset in layers:
        columns[name] = slice(offset, offset + k_out * k_in)
        row = dict.fromkeys(DIAGNOSTIC_COLUMNS, math.nan)
        row.update(layer=name, kind="projected", out_dim=k_out, in_dim=k_in, n_samples=n_samples)
        row.update(damping=0.0, damping_steps=0, solver="", forward_dtype="", cond_limit=math.nan)
        row["note"] = f"projected from {out_dim} x {in_dim}"
        if precondition == "none":
            inverses[name] = None
            row.update(cond=1.0, note=row["note"] + "; no curvature (precondition: none)")
        else:
            basis = _eigenbasis(sums, name, precondition, row)
            inverses[name] = _damped_inverse(
                sums["gauss_newton"][name] / n_samples, basis, name, settings, row
            )
        rows.append(row)
    return ProjectedCurvature(inverses, columns, pd.DataFrame(rows, columns=list(DIAGNOSTIC_COLUMNS)))


def _eigenbasis(sums, name: str, precondition: str, row: dict) -> torch.Tensor | None:
    """EK-FAC's eigenbasis Q_S ⊗ Q_A of the layer's projected Kronecker factors (the smallest raw
    eigenvalues into ``row``); None for gauss_newton (the block's own eigenvectors)."""
    if precondition != "ekfac":
        return None
    vectors = []
    for kind, short in (("gradient", "S"), ("activation", "A")):
        e = symmetric_eigh(sums[kind][name], f"layer {name!r}: projected factor {short}", "cpu")
        row[f"{kind}_min_raw"] = e.min_raw
        row["solver"] += f"{short}: {e.solver}; "
        vectors.append(e.vectors.to(torch.float64))
    return torch.kron(*vectors)


def _damped_inverse(
    matrix: torch.Tensor, basis: torch.Tensor | None, name: str, settings: InfluenceSettings, row: dict
) -> np.ndarray:
    """V diag(1/(Λ + λ)) Vᵀ of one layer's H̃ ≈ V Λ Vᵀ: V its eigenvectors, or ``basis`` with Λ the
    diagonal of Vᵀ H̃ V (E[(vᵀ g̃)²]: EK-FAC's corrected eigenvalues); the diagnostics into ``row``."""
    if basis is None:
        e = symmetric_eigh(matrix, f"layer {name!r}: projected Gauss-Newton matrix", "cpu")
        values, v = e.values.clamp_min(0.0), e.vectors.to(torch.float64)
        row.update(activation_min_raw=e.min_raw, solver=e.solver)
    else:
        v = basis
        values = ((v.T @ matrix) * v.T).sum(1).clamp_min(0.0)
    lam, note = initial_damping(values, settings.damping, settings.damping_mode, name)
    damped = damping_ladder(
        values, lam, name, torch.float64, settings.damping_growth, settings.max_damping_steps
    )
    row.update(
        cond=condition_number(values, damped.damping),
        min_eig=float(values.min()),
        max_eig=float(values.max()),
        damping=damped.damping,
        damping_steps=damped.steps,
        note="; ".join(x for x in (row["note"], note, damped.note) if x),
    )
    return ((v * damped.inverse) @ v.T).numpy()
