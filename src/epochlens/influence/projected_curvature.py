"""The curvature of the projected methods: per layer, the projected Gauss-Newton matrix
H̃ = E_n[g̃_n g̃_nᵀ] of the Fisher's projected gradients (:mod:`.projection`), in two steps:
:func:`projected_basis` eigendecomposes it once per store (:mod:`.eigen`'s robust solver; ``ekfac``:
the eigenbasis of the projected Kronecker factors, eigenvalues refitted from H̃) and is saved beside
the store; :func:`projected_curvature` damps and inverts it at a damping (:mod:`.damping`: relative
λ = damping x mean eigenvalue by default, the ladder where a solve is not finite) with the factor
methods' per-layer diagnostics table. With projections that are the identity, H̃ is the layer's exact
(block-diagonal) Gauss-Newton matrix; with ``precondition: none`` there is no curvature (projected
gradient dot products).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from epochlens.atomic import atomic_path
from epochlens.errors import InfluenceError, NoFiniteSamplesError
from epochlens.influence.damping import condition_number, damping_ladder, initial_damping
from epochlens.influence.eigen import symmetric_eigh
from epochlens.influence.gradient_store import ShardInfo, merged_fisher
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


@dataclass
class ProjectedBasis:
    """Each layer's projected curvature as eigenpairs, before damping (``curvature.pt`` of a store).

    Attributes:
        layers: [name, out_dim, in_dim, k_out, k_in, offset] per layer, in column order.
        n_samples: samples of the Fisher's sums; precondition: gauss_newton, ekfac or none.
        values, vectors: layer -> eigenvalues (size,) >= 0 and eigenvectors (size, size), float64
            (None with ``none``).
        notes: layer -> its diagnostics known before damping (solver, smallest raw eigenvalues).
        key: the store's key (checked when scoring).
    """

    layers: list
    n_samples: int
    precondition: str
    values: dict
    vectors: dict
    notes: dict
    key: dict

    def save(self, path: str | Path) -> None:
        with atomic_path(path) as tmp:
            torch.save(asdict(self), tmp)

    @classmethod
    def load(cls, path: str | Path) -> ProjectedBasis:
        try:
            return cls(**torch.load(path, map_location="cpu", weights_only=True))
        except Exception as exc:
            raise InfluenceError(
                f"{path}: not a readable projected curvature ({type(exc).__name__}: {str(exc)[:200]}). "
                "Delete it and compute it again."
            ) from exc


def projected_basis(
    sums: Mapping[str, Mapping[str, torch.Tensor]],
    n_samples: int,
    layers: list,
    precondition: str = "gauss_newton",
    key: dict | None = None,
) -> ProjectedBasis:
    """Eigenpairs of the layers' projected curvature from the Fisher's sums over ``n_samples``
    samples (:func:`epochlens.influence.projection.fisher_sums`): ``gauss_newton`` (the whole
    block's), ``ekfac`` (the eigenbasis Q_S ⊗ Q_A of the projected Kronecker factors, eigenvalues
    diag(Qᵀ H̃ Q) = E[(qᵀ g̃)²]: exactly EK-FAC where nothing is projected) or ``none``.

    Raises:
        NoFiniteSamplesError: no sample in the sums. EigenError.
    """
    if precondition != "none" and n_samples < 1:
        raise NoFiniteSamplesError(
            "no training sample has finite projected Fisher gradients: the projected curvature is empty"
        )
    values, vectors, notes = {}, {}, {}
    for name, *_ in layers:
        notes[name] = {"solver": "", "activation_min_raw": math.nan, "gradient_min_raw": math.nan}
        if precondition == "none":
            values[name] = vectors[name] = None
            continue
        matrix = sums["gauss_newton"][name] / n_samples
        if precondition == "ekfac":
            v = _eigenbasis(sums, name, notes[name])
            values[name] = ((v.T @ matrix) * v.T).sum(1).clamp_min(0.0)
        else:
            e = symmetric_eigh(matrix, f"layer {name!r}: projected Gauss-Newton matrix", "cpu")
            v, values[name] = e.vectors.to(torch.float64), e.values.clamp_min(0.0)
            notes[name].update(solver=e.solver, activation_min_raw=e.min_raw)
        vectors[name] = v
    return ProjectedBasis(layers, n_samples, precondition, values, vectors, notes, key or {})


def store_curvature(infos: Sequence[str | Path], precondition: str) -> ProjectedBasis:
    """The projected curvature of a gradient store from its shards' ``.pt`` (in order), before any
    damping: eigendecomposed once for every scoring of the store (``curvature.pt``)."""
    shards = [ShardInfo.load(p) for p in infos]
    sums, n = merged_fisher(shards)
    return projected_basis(sums, n, shards[0].layers, precondition, shards[0].key)


def _eigenbasis(sums, name: str, note: dict) -> torch.Tensor:
    """EK-FAC's eigenbasis Q_S ⊗ Q_A of the layer's projected Kronecker factors."""
    vectors = []
    for kind, short in (("gradient", "S"), ("activation", "A")):
        e = symmetric_eigh(sums[kind][name], f"layer {name!r}: projected factor {short}", "cpu")
        note[f"{kind}_min_raw"] = e.min_raw
        note["solver"] += f"{short}: {e.solver}; "
        vectors.append(e.vectors.to(torch.float64))
    return torch.kron(*vectors)


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
