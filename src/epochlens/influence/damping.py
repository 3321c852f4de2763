"""Damping of a layer's curvature: how λ is chosen, refused, and raised where a solve is not finite.

A layer's preconditioner is (G + λI)⁻¹ with G's eigenvalues Λ (for K-FAC the products
Λ_S[i]·Λ_A[j], for EK-FAC the corrected ones, for the diagonal method the diagonal itself).

* relative (default): λ = damping × mean(Λ). The mean eigenvalue is trace(G)/dim, the average
  curvature per parameter, so the same setting fits layers whose curvature differs by orders of
  magnitude (inputs scaled by 1e4 scale A by 1e8, and λ with it).
* absolute: λ = damping.

Refused (``DampingError``): λ that underflows, i.e. λ = 0 or λ < eps64·max(Λ). An eigensolver
returns eigenvalues with an absolute error of about eps64·max(Λ), so smaller damping divides the
null-space directions (dead units, constant or duplicated features) by rounding noise.

A layer whose curvature is all zero (every fitted gradient of it vanished, e.g. all-zero inputs to
a bias-free layer) has no scale for relative damping; λ = 1 is used and noted. Its fitted training
gradients are zero, so their scores do not depend on that choice.

Ladder: starting from λ, the damping is multiplied by ``growth`` until the solve is finite in the
precondition dtype: Λ + λ > 0, 1/(Λ + λ) finite, and the typical solved component
√Λ/(Λ + λ) finite (float32 solves overflow where Λ + λ < 3e-39). The steps taken are recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from epochlens.errors import DampingError

EPS64 = float(torch.finfo(torch.float64).eps)


@dataclass
class Damped:
    """A layer's damped inverse eigenvalues and how they were obtained.

    Attributes:
        inverse: 1/(Λ + λ), same shape as Λ, float64.
        damping: λ finally used.
        steps: ladder steps taken (0: the initial λ was fine).
        note: why λ is not the configured one, if it is not ("" otherwise).
    """

    inverse: torch.Tensor
    damping: float
    steps: int
    note: str = ""


def initial_damping(eigenvalues: torch.Tensor, damping: float, mode: str, layer: str) -> tuple[float, str]:
    """λ for ``eigenvalues`` (any shape, >= 0) and the configured ``damping`` and ``mode``.

    Returns:
        (λ, note); note explains a zero-curvature layer's λ = 1.

    Raises:
        DampingError: λ is zero or below eps64·max(Λ) (see the module doc).
    """
    max_eig = float(eigenvalues.max()) if eigenvalues.numel() else 0.0
    mean_eig = float(eigenvalues.to(torch.float64).mean()) if eigenvalues.numel() else 0.0
    if max_eig <= 0.0:
        return 1.0, "zero curvature: every fitted gradient of this layer vanished; damping 1"
    lam = damping * mean_eig if mode == "relative" else float(damping)
    floor = EPS64 * max_eig
    if not (math.isfinite(lam) and lam > 0.0 and lam >= floor):
        how = f"{damping:g} x mean eigenvalue {mean_eig:.3g}" if mode == "relative" else "absolute"
        minimum = floor / mean_eig if mode == "relative" else floor
        raise DampingError(
            f"layer {layer!r}: damping λ = {lam:.3g} ({how}) underflows: it is below the eigensolver's "
            f"resolution eps64 x largest eigenvalue = {floor:.3g}, so the solve would divide rounding "
            f"noise by it. Use influence damping >= {minimum:.3g} ({mode})."
        )
    return lam, ""


def damping_ladder(
    eigenvalues: torch.Tensor,
    damping: float,
    layer: str,
    dtype: torch.dtype = torch.float64,
    growth: float = 10.0,
    max_steps: int = 30,
) -> Damped:
    """Raise λ by ``growth`` until the damped solve is finite in ``dtype`` (see the module doc).

    Args:
        eigenvalues: Λ, any shape, float64, >= 0.
        damping: the initial λ > 0.
        layer: the layer's name, for messages.
        dtype: dtype in which solves are carried out.

    Raises:
        DampingError: still not finite after ``max_steps`` steps.
    """
    eig = eigenvalues.to(torch.float64)
    lam = float(damping)
    root = eig.sqrt()
    for step in range(max_steps + 1):
        shifted = eig + lam
        inverse = 1.0 / shifted
        if (
            bool((shifted > 0).all())
            and bool(torch.isfinite(inverse.to(dtype)).all())
            and bool(torch.isfinite((root * inverse).to(dtype)).all())
        ):
            note = f"raised {step} times by {growth:g}: solve not finite in {dtype}" if step else ""
            return Damped(inverse, lam, step, note)
        lam *= growth
    raise DampingError(
        f"layer {layer!r}: the damped solve is not finite in {dtype} even with λ = {lam / growth:.3g} "
        f"after {max_steps} ladder steps. Use precondition_dtype float64, or exclude the layer."
    )


def condition_number(eigenvalues: torch.Tensor, damping: float) -> float:
    """(max Λ + λ)/(min Λ + λ): the condition number of the damped matrix that is inverted."""
    if eigenvalues.numel() == 0:
        return math.nan
    return float((eigenvalues.max() + damping) / (eigenvalues.min() + damping))
