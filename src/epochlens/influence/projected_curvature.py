"""The curvature of the projected methods, damped: :func:`projected_curvature` inverts each layer's
eigendecomposed projected Gauss-Newton matrix (:mod:`.projected_basis`, once per store) at a damping
(:mod:`.damping`: relative λ = damping x mean eigenvalue by default, the ladder where a solve is not
finite), with the factor methods' per-layer diagnostics table. With projections that are the
identity, H̃ is the layer's exact (block-diagonal) Gauss-Newton matrix; with ``precondition: none``
there is no curvature (projected gradient dot products).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from epochlens.influence.damping import condition_number, damping_ladder, initial_damping
from epochlens.influence.precondition import DIAGNOSTIC_COLUMNS
from epochlens.influence.projected_basis import ProjectedBasis
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


def projected_curvature(basis: ProjectedBasis, settings: InfluenceSettings) -> ProjectedCurvature:
    """The layers' damped inverses V diag(1/(Λ + λ)) Vᵀ at ``settings``' damping, and the
    diagnostics table (``kind`` projected; the note says from which shape).

    Raises:
        DampingError: a damping that underflows, or a solve not finite after the ladder.
    """
    inverses, columns, rows = {}, {}, []
    for name, out_dim, in_dim, k_out, k_in, offset in basis.layers:
        columns[name] = slice(offset, offset + k_out * k_in)
        row = dict.fromkeys(DIAGNOSTIC_COLUMNS, math.nan)
        row.update(layer=name, kind="projected", out_dim=k_out, in_dim=k_in, n_samples=basis.n_samples)
        row.update(damping=0.0, damping_steps=0, forward_dtype="", cond_limit=math.nan, **basis.notes[name])
        row["note"] = f"projected from {out_dim} x {in_dim}"
        if basis.precondition == "none":
            inverses[name] = None
            row.update(cond=1.0, note=row["note"] + "; no curvature (precondition: none)")
        else:
            inverses[name] = _damped_inverse(basis.values[name], basis.vectors[name], name, settings, row)
        rows.append(row)
    return ProjectedCurvature(inverses, columns, pd.DataFrame(rows, columns=list(DIAGNOSTIC_COLUMNS)))


def _damped_inverse(
    values: torch.Tensor, v: torch.Tensor, name: str, settings: InfluenceSettings, row: dict
) -> np.ndarray:
    """V diag(1/(Λ + λ)) Vᵀ; the damping's diagnostics into ``row``."""
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
