"""The damped inverse curvature of each layer, applied to per-sample gradient matrices.

For a layer with gradient matrices G (out, in_dim) and eigenvalues Λ (out, in_dim), λ its damping:

* kfac / ekfac: P G = Q_S [(Q_Sᵀ G Q_A) / (Λ + λ)] Q_Aᵀ  (Λ = Λ_S Λ_Aᵀ for K-FAC, corrected for EK-FAC)
* diagonal:     P G = G / (D + λ)
* identity:     P G = G

and the quadratic form Gᵀ P G = Σ (Q_Sᵀ G Q_A)² / (Λ + λ) needs no rotation back. Building a
:class:`Preconditioner` resolves every layer's damping (refusals, ladder) and its diagnostics row.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from epochlens.errors import InfluenceError
from epochlens.influence.damping import condition_number, damping_ladder, initial_damping
from epochlens.influence.factors import InfluenceFactors
from epochlens.influence.layers import per_sample_gradient, rotated_gradient
from epochlens.influence.settings import InfluenceSettings

DIAGNOSTIC_COLUMNS = (
    "layer",
    "cond",
    "min_eig",
    "max_eig",
    "damping",
    "damping_steps",
    "kind",
    "out_dim",
    "in_dim",
    "n_samples",
    "activation_min_raw",
    "gradient_min_raw",
    "solver",
    "note",
)


class Preconditioner:
    """Per-layer damped inverses on a device, and the diagnostics table.

    Args:
        factors: fitted factors (their method decides the preconditioner).
        settings: damping, ladder and precondition dtype (their method must equal the factors').
        device: where solves run.
    """

    def __init__(self, factors: InfluenceFactors, settings: InfluenceSettings, device: torch.device) -> None:
        if settings.method != factors.method:
            raise InfluenceError(
                f"the factors were fitted for method {factors.method!r}, the settings ask for "
                f"{settings.method!r}; fit factors for {settings.method!r} (or use its cache file)."
            )
        self.method = settings.method
        self.dtype = torch.float64 if settings.precondition_dtype == "float64" else torch.float32
        if device.type == "mps" and self.dtype == torch.float64:
            self.dtype = torch.float32  # MPS has no float64
        self.device = device
        self._inverse: dict[str, torch.Tensor] = {}
        self._rot: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        rows = []
        for name, lf in factors.layers.items():
            row = dict.fromkeys(DIAGNOSTIC_COLUMNS, math.nan)
            row.update(
                layer=name,
                kind=lf.kind,
                out_dim=lf.out_dim,
                in_dim=lf.in_dim,
                n_samples=lf.n_samples,
                damping=0.0,
                damping_steps=0,
                activation_min_raw=lf.min_raw.get("A", math.nan),
                gradient_min_raw=lf.min_raw.get("S", math.nan),
                solver="; ".join(f"{k}: {v}" for k, v in lf.solver.items()),
                note="",
            )
            eig = lf.eigenvalues(self.method)
            if eig is not None:
                eig = eig.to(torch.float64).clamp_min(0.0)
                lam, note = initial_damping(eig, settings.damping, settings.damping_mode, name)
                damped = damping_ladder(
                    eig, lam, name, self.dtype, settings.damping_growth, settings.max_damping_steps
                )
                self._inverse[name] = damped.inverse.to(device=device, dtype=self.dtype)
                if self.method in ("kfac", "ekfac"):
                    self._rot[name] = (
                        lf.gradient_vectors.to(device=device, dtype=self.dtype),
                        lf.activation_vectors.to(device=device, dtype=self.dtype),
                    )
                row.update(
                    cond=condition_number(eig, damped.damping),
                    min_eig=float(eig.min()),
                    max_eig=float(eig.max()),
                    damping=damped.damping,
                    damping_steps=damped.steps,
                    note="; ".join(s for s in (note, damped.note) if s),
                )
            rows.append(row)
        self.diagnostics = pd.DataFrame(rows, columns=list(DIAGNOSTIC_COLUMNS))

    def apply(self, name: str, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """P G (B, out, in_dim) for G = Σ_t ds_t a_tᵀ, a (B, T, in_dim), ds (B, T, out)."""
        a, ds = a.to(self.dtype), ds.to(self.dtype)
        if self.method == "identity":
            return per_sample_gradient(a, ds)
        inv = self._inverse[name]
        if self.method == "diagonal":
            return per_sample_gradient(a, ds) * inv
        qs, qa = self._rot[name]
        return qs @ (rotated_gradient(a, ds, qs, qa) * inv) @ qa.T

    def quadratic(self, name: str, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """Gᵀ P G per sample, (B,), for G = Σ_t ds_t a_tᵀ (shapes as in :meth:`apply`)."""
        a, ds = a.to(self.dtype), ds.to(self.dtype)
        if self.method in ("identity", "diagonal"):
            g = per_sample_gradient(a, ds)
            g2 = g * g
            return (g2 if self.method == "identity" else g2 * self._inverse[name]).sum((1, 2))
        r = rotated_gradient(a, ds, *self._rot[name])
        return (r * r * self._inverse[name]).sum((1, 2))


def factor_diagnostics(factors: InfluenceFactors, settings: InfluenceSettings | None = None) -> pd.DataFrame:
    """Per-layer conditioning table for ``factors`` under ``settings`` (damping), one row per layer.

    Columns: layer, cond ((max+λ)/(min+λ) of the inverted matrix), min_eig, max_eig (of the
    undamped curvature: Λ_S Λ_Aᵀ for kfac, corrected for ekfac, the diagonal for diagonal; NaN for
    identity), damping (λ used), damping_steps (ladder steps), kind, out_dim, in_dim, n_samples,
    activation_min_raw / gradient_min_raw (smallest eigenvalue of A / S before clamping), solver
    (eigensolver per factor, with any fallbacks), note (why λ differs from the configured one).
    """
    settings = settings or factors.settings()
    return Preconditioner(factors, settings, torch.device("cpu")).diagnostics
