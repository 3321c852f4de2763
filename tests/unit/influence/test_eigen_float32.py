"""Large factors eigendecomposed in float32 (influence.eigh_float32_from): checked against a matrix
whose eigenpairs are known exactly, with a spectrum spread over six decades as a covariance's."""

from __future__ import annotations

import torch

from epochlens.influence.eigen import symmetric_eigh

DIM = 2100


def known_matrix(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """M = Q diag(w) Qᵀ in float64 with Q orthogonal and w from 1e-6 to 1."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(DIM, DIM, generator=g, dtype=torch.float64))
    w = torch.logspace(-6, 0, DIM, dtype=torch.float64)
    return (q * w) @ q.T, w, q


def test_a_large_factor_in_float32_gives_eigenvalues_and_damped_solves_of_float64_quality() -> None:
    m, w, q = known_matrix()
    e = symmetric_eigh(m, "layer 'x': A", float32_from=2048)
    assert e.solver == "cpu-float32"
    assert e.values.dtype == e.vectors.dtype == torch.float64
    assert (e.values - w).abs().max() <= 1e-6 * w.max()  # ascending, as w
    ortho = e.vectors.T @ e.vectors - torch.eye(DIM, dtype=torch.float64)
    assert ortho.abs().max() < 1e-5
    # What influence does with them: a damped inverse (relative damping 0.1 of the mean eigenvalue).
    lam = 0.1 * float(w.mean())
    g = torch.randn(DIM, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = q @ ((q.T @ g) / (w + lam)[:, None])
    ours = e.vectors @ ((e.vectors.T @ g) / (e.values + lam)[:, None])
    assert (ours - exact).norm() <= 1e-4 * exact.norm()


def test_below_the_threshold_and_without_it_the_solve_stays_float64() -> None:
    m, w, _ = known_matrix()
    for limit in (4096, None):
        e = symmetric_eigh(m, "layer 'x': A", float32_from=limit)
        assert e.solver == "cpu"
        assert (e.values - w).abs().max() <= 1e-12 * w.max()
