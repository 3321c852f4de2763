"""The damped inverse curvature of each layer, applied to per-sample gradient matrices.

For a layer with gradient matrices G (out, in_dim) and eigenvalues Λ (out, in_dim), λ its damping:

* kfac / ekfac: P G = Q_S [(Q_Sᵀ G Q_A) / (Λ + λ)] Q_Aᵀ  (Λ = Λ_S Λ_Aᵀ for K-FAC, corrected for EK-FAC)
* diagonal:     P G = G / (D + λ)
* identity:     P G = G

and the quadratic form Gᵀ P G = Σ (Q_Sᵀ G Q_A)² / (Λ + λ) needs no rotation back. Building a
:class:`Preconditioner` resolves every layer's damping (refusals, ladder) and its diagnostics row.

Conditioning against the forward pass's precision: the gradients and the factors come from a forward
and backward pass in the compute dtype, so directions of the curvature below ~eps·max(Λ) of that dtype
(float32: eps = 1.2e-7) are rounding noise, whatever precision the solve runs in. A layer whose
condition number (max Λ + λ)/(min Λ + λ) at the chosen damping exceeds 1/eps of the forward dtype
(float32: 8.4e6) amplifies that noise: it is warned about and recorded (diagnostics columns
``forward_dtype``, ``cond_limit`` = 1/eps, ``safe_damping``: the damping setting, in the configured
mode's units, that brings the condition number down to cond_limit/10, and a note).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import pandas as pd
import torch

from epochlens.errors import InfluenceError
from epochlens.influence.damping import condition_number, damping_ladder, initial_damping
from epochlens.influence.factors import InfluenceFactors
from epochlens.influence.layers import gradient_chunks
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
    "forward_dtype",
    "cond_limit",
    "safe_damping",
    "note",
)

_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def condition_limit(dtype: torch.dtype) -> float:
    """1/eps of ``dtype``: the largest condition number whose smallest direction is above rounding."""
    return 1.0 / float(torch.finfo(dtype).eps)


def safe_damping(eig: torch.Tensor, limit: float, mode: str) -> float:
    """The damping setting (``mode`` units) that gives (max + λ)/(min + λ) = ``limit``/10; 0 if none needed.

    λ = (M − K m)/(K − 1) with K = limit/10; relative mode divides by the mean eigenvalue.
    """
    k = limit / 10.0
    big, small = float(eig.max()), float(eig.min())
    lam = max(0.0, (big - k * small) / (k - 1.0))
    if mode == "relative":
        mean = float(eig.mean())
        return lam / mean if mean > 0 else math.nan
    return lam


class Preconditioner:
    """Per-layer damped inverses on a device, and the diagnostics table.

    Args:
        factors: fitted factors (their method decides the preconditioner).
        settings: damping, ladder and precondition dtype (their method must equal the factors').
        device: where solves run.
        forward_dtype: dtype of the forward/backward that produces the gradients to precondition
            (None: the factors' compute dtype, if recorded). The coarser of it and the factors'
            compute dtype sets the condition-number limit (see the module doc).
        layer_notes: layer name -> a note for its diagnostics row (e.g. a weight tied to an
            untracked module).
    """

    def __init__(
        self,
        factors: InfluenceFactors,
        settings: InfluenceSettings,
        device: torch.device,
        forward_dtype: torch.dtype | None = None,
        layer_notes: dict[str, str] | None = None,
    ) -> None:
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
        layer_notes = layer_notes or {}
        dtypes = [d for d in (forward_dtype, _DTYPES.get(getattr(factors, "compute_dtype", ""))) if d]
        coarse = max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else None
        limit = condition_limit(coarse) if coarse is not None else math.nan
        ill = []
        rows = []
        forward = str(coarse).replace("torch.", "") if coarse is not None else ""
        for name, lf in factors.layers.items():
            row = _diagnostic_row(name, lf, forward, limit)
            eig = lf.eigenvalues(self.method)
            if eig is not None:
                row.update(self._damp_layer(name, lf, eig, settings, limit, forward, layer_notes, ill))
            elif layer_notes.get(name):
                row["note"] = layer_notes[name]
            rows.append(row)
        self.diagnostics = pd.DataFrame(rows, columns=list(DIAGNOSTIC_COLUMNS))
        if ill:
            detail = "; ".join(f"{n!r}: {c:.3g}, safe damping >= {sd:.3g}" for n, c, sd in ill)
            warnings.warn(
                f"influence: {len(ill)} layer(s) have a condition number above 1/eps of the "
                f"{str(coarse).replace('torch.', '')} forward pass ({limit:.3g}) at the chosen damping, so "
                f"their smallest curvature directions are rounding noise of the gradients ({detail}; "
                f"{settings.damping_mode} damping). Raise influence damping to at least that value.",
                stacklevel=4,
            )

    def _damp_layer(
        self, name, lf, eig, settings, limit: float, forward: str, layer_notes, ill: list
    ) -> dict:
        """Damp one layer's eigenvalues (the ladder), keep its damped inverse (and eigenbases) on the
        device, and return its diagnostics; a layer whose condition number exceeds what the forward
        dtype resolves is noted and added to ``ill``."""
        eig = eig.to(torch.float64).clamp_min(0.0)
        lam, note = initial_damping(eig, settings.damping, settings.damping_mode, name)
        damped = damping_ladder(
            eig, lam, name, self.dtype, settings.damping_growth, settings.max_damping_steps
        )
        self._inverse[name] = damped.inverse.to(device=self.device, dtype=self.dtype)
        if self.method in ("kfac", "ekfac"):
            self._rot[name] = (
                lf.gradient_vectors.to(device=self.device, dtype=self.dtype),
                lf.activation_vectors.to(device=self.device, dtype=self.dtype),
            )
        cond = condition_number(eig, damped.damping)
        notes = [note, damped.note, layer_notes.get(name, "")]
        safe = safe_damping(eig, limit, settings.damping_mode) if math.isfinite(limit) else math.nan
        if math.isfinite(limit) and cond > limit:
            notes.append(
                f"condition number {cond:.3g} above 1/eps of the {forward} forward "
                f"({limit:.3g}); damping >= {safe:.3g} ({settings.damping_mode}) is safe"
            )
            ill.append((name, cond, safe))
        return dict(
            cond=cond,
            min_eig=float(eig.min()),
            max_eig=float(eig.max()),
            damping=damped.damping,
            damping_steps=damped.steps,
            safe_damping=safe,
            note="; ".join(s for s in notes if s),
        )

    def apply(
        self, name: str, a: torch.Tensor, ds: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """P G (B, out, in_dim) for G = Σ_t ds_t a_tᵀ, a (B, T, in_dim), ds (B, T, out), written into
        ``out`` if given (e.g. rows of a preallocated store), a chunk of samples at a time
        (:func:`gradient_chunks`)."""
        a, ds = a.to(self.dtype), ds.to(self.dtype)
        if out is None:
            out = torch.empty(a.shape[0], ds.shape[2], a.shape[2], dtype=self.dtype, device=a.device)
        rot = self._rot.get(name)
        for part, g in gradient_chunks(a, ds, rot, copies=2):
            if self.method == "identity":
                out[part] = g
            elif self.method == "diagonal":
                torch.mul(g, self._inverse[name], out=out[part])
            else:
                torch.matmul(rot[0] @ g.mul_(self._inverse[name]), rot[1].T, out=out[part])
        return out

    def apply_in_basis(
        self, name: str, a: torch.Tensor, ds: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """D Rᵀ G (B, out, in_dim): G (as in :meth:`apply`) in the layer's eigenbasis R (G ↦ Q_Sᵀ G Q_A
        for kfac/ekfac, none for diagonal/identity) times the damped inverse eigenvalues D, so that
        g_qᵀ P g_n = ⟨D Rᵀ G_q, Rᵀ G_n⟩ with Rᵀ G_n from :meth:`in_basis`. For Kronecker factors this
        skips :meth:`apply`'s rotation back, its dearest step (out·in·(out + in) multiply-adds per
        sample, 12 G for ResNet-18's layer4). Written into ``out`` if given."""
        a, ds = a.to(self.dtype), ds.to(self.dtype)
        if out is None:
            out = torch.empty(a.shape[0], ds.shape[2], a.shape[2], dtype=self.dtype, device=a.device)
        inverse = self._inverse.get(name)
        for part, g in self.in_basis(name, a, ds):
            if inverse is None:
                out[part] = g
            else:
                torch.mul(g, inverse, out=out[part])
        return out

    def in_basis(
        self, name: str, a: torch.Tensor, ds: torch.Tensor, budget: int | None = None
    ) -> Iterator[tuple[slice, torch.Tensor]]:
        """(samples, Rᵀ G) by chunks of samples (:func:`gradient_chunks`; R as in
        :meth:`apply_in_basis`)."""
        a, ds = a.to(self.dtype), ds.to(self.dtype)
        return gradient_chunks(a, ds, self._rot.get(name), budget=budget)

    def quadratic(self, name: str, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """Gᵀ P G per sample, (B,), for G = Σ_t ds_t a_tᵀ (shapes as in :meth:`apply`)."""
        a, ds = a.to(self.dtype), ds.to(self.dtype)
        total = torch.empty(a.shape[0], dtype=self.dtype, device=a.device)
        inverse = self._inverse.get(name)
        for part, g in gradient_chunks(a, ds, self._rot.get(name)):
            g2 = g.square_() if inverse is None else g.square_().mul_(inverse)
            total[part] = g2.sum((1, 2))
        return total


def factor_diagnostics(factors: InfluenceFactors, settings: InfluenceSettings | None = None) -> pd.DataFrame:
    """Per-layer conditioning table for ``factors`` under ``settings`` (damping), one row per layer.

    Columns: layer, cond ((max+λ)/(min+λ) of the inverted matrix), min_eig, max_eig (of the
    undamped curvature: Λ_S Λ_Aᵀ for kfac, corrected for ekfac, the diagonal for diagonal; NaN for
    identity), damping (λ used), damping_steps (ladder steps), kind, out_dim, in_dim, n_samples,
    activation_min_raw / gradient_min_raw (smallest eigenvalue of A / S before clamping), solver
    (eigensolver per factor, with any fallbacks), forward_dtype / cond_limit / safe_damping (the
    forward pass's precision, 1/eps of it, and the damping that keeps cond at cond_limit/10), note
    (why λ differs from the configured one; a condition number above cond_limit).
    """
    settings = settings or factors.settings()
    return Preconditioner(factors, settings, torch.device("cpu")).diagnostics


def _diagnostic_row(name: str, lf, forward: str, limit: float) -> dict:
    """A layer's row of the diagnostics table before damping (NaN where not yet known)."""
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
        forward_dtype=forward,
        cond_limit=limit,
        note="",
    )
    return row
