"""Robust symmetric eigendecomposition of curvature factors.

The failure users hit (``cusolver error: CUSOLVER_STATUS_INVALID_VALUE`` at the last of 145
matrices) has two causes: NaN/Inf in a factor (one bad sample poisons a covariance), and device
solvers failing on large or ill-conditioned matrices. Here:

1. the factor is checked for NaN/Inf *before* solving, with an error that names the layer and the
   factor (NaN samples are left out upstream, so this means an overflow);
2. it is cast to float64 and symmetrised, (M + Mᵀ)/2 (a copy only where M is not symmetric already);
3. solvers are tried in order until one returns finite eigenpairs: the compute device's
   ``torch.linalg.eigh`` (skipped on the CPU, on devices without float64, and above
   ``max_device_dim``), the CPU's ``torch.linalg.eigh`` (LAPACK syevd), SciPy's ``evr`` driver, and
   finally the CPU solver on M + ε·mean(diag M)·I with ε from 1e-12 upwards (the eigenvectors of a
   shifted matrix are the same, and the shift is subtracted from the eigenvalues again);
4. the result is checked for NaN/Inf *after* solving; negative eigenvalues (rounding of a positive
   semi-definite matrix) are clamped to zero and the smallest raw one is recorded.

Which solver ran, and why the others did not, is returned and goes into the diagnostics table.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from epochlens.errors import EigenError


@dataclass
class Eigh:
    """Eigenpairs of a symmetric positive semi-definite matrix (d, d), on the CPU, float64.

    Attributes:
        values: (d,) ascending, clamped at 0.
        vectors: (d, d) orthonormal columns.
        solver: the solver that succeeded, e.g. "cpu" or "cuda"; with "<-" the failures before it.
        min_raw: smallest eigenvalue before clamping.
    """

    values: torch.Tensor
    vectors: torch.Tensor
    solver: str
    min_raw: float


def _torch_eigh(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.eigh(matrix)


def _scipy_eigh(matrix: torch.Tensor, driver: str = "evr") -> tuple[torch.Tensor, torch.Tensor]:
    import scipy.linalg

    values, vectors = scipy.linalg.eigh(matrix.numpy(), driver=driver, check_finite=False)
    return torch.from_numpy(values), torch.from_numpy(vectors)


def _finite(values: torch.Tensor, vectors: torch.Tensor) -> bool:
    return bool(torch.isfinite(values).all()) and bool(torch.isfinite(vectors).all())


def symmetric_eigh(
    matrix: torch.Tensor,
    what: str,
    device: torch.device | str | None = None,
    max_device_dim: int = 8192,
    float32_from: int | None = None,
) -> Eigh:
    """Eigendecompose a symmetric PSD ``matrix`` (d, d) robustly (see the module doc).

    Args:
        matrix: the factor, any float dtype and device.
        what: what it is, for messages, e.g. "layer 'fc': activation covariance A".
        device: where to try the fast solver first (None: the matrix's device).
        max_device_dim: above this dimension the device solver is skipped.
        float32_from: from this dimension on, each device solves in float32 first (ssyevd: ~3x
            faster at 4608, eigenvectors orthonormal to ~1e-6). None: float64 only.

    Raises:
        EigenError: NaN/Inf in the factor, or no solver produced finite eigenpairs.
    """
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise EigenError(f"{what}: expected a square matrix, got shape {tuple(matrix.shape)}")
    device = torch.device(device) if device is not None else matrix.device
    bad = 0 if bool(torch.isfinite(matrix).all()) else int((~torch.isfinite(matrix)).sum())
    if bad:
        raise EigenError(
            f"{what} ({matrix.shape[0]}x{matrix.shape[0]}) holds {bad} NaN/Inf entries before the "
            "eigendecomposition. Samples with NaN/Inf gradients are already left out, so this is an "
            "overflow: the layer's inputs or gradients exceed float64. Check the inputs' scale and the "
            "checkpoint, or exclude the layer."
        )
    m = matrix.detach().to(torch.float64)
    if not torch.equal(m, m.T):  # a symmetric one (mirrored sums) is used as it is: no copies
        m = (m + m.T).mul_(0.5)
    dim = m.shape[0]
    failures: list[str] = []
    for name, solve in _solvers(m, device, max_device_dim, float32_from, failures):
        try:
            values, vectors = solve()  # type: ignore[operator]
        except Exception as exc:  # LinAlgError, cusolver RuntimeError, a device torch was not built for
            failures.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        values, vectors = values.cpu().to(torch.float64), vectors.cpu().to(torch.float64)
        if not _finite(values, vectors):
            failures.append(f"{name}: non-finite eigenpairs")
            continue
        if any(not f.startswith(f"{device.type}: dim ") for f in failures):  # not just the size rule
            warnings.warn(
                f"{what}: eigendecomposition fell back to {name} after: {'; '.join(failures)}",
                stacklevel=2,
            )
        solver = name if not failures else f"{name} <- " + "; ".join(failures)
        min_raw = float(values.min()) if dim else 0.0
        return Eigh(values.clamp_min(0.0), vectors, solver, min_raw)
    raise EigenError(
        f"{what} ({dim}x{dim}): no eigensolver produced finite eigenpairs ({'; '.join(failures)}). "
        "Exclude the layer, or report the factor (saved with save_factors) as a bug."
    )


def _solvers(
    m: torch.Tensor, device: torch.device, max_device_dim: int, float32_from: int | None, failures: list
):
    """The solvers to try on ``m``, in order (module doc); one skipped for its size in ``failures``."""
    dim = m.shape[0]
    single = float32_from is not None and dim >= float32_from
    attempts: list[tuple[str, object]] = []
    if device.type == "cuda" and dim > max_device_dim:  # MPS has no float64; the CPU is tried next anyway
        failures.append(f"{device.type}: dim {dim} > max_device_eigh_dim {max_device_dim}")
    elif device.type == "cuda":
        attempts += [("cuda-float32", lambda: _torch_eigh(m.to(device, torch.float32)))] if single else []
        attempts.append(("cuda", lambda: _torch_eigh(m.to(device))))
    m_cpu = m.cpu()
    attempts += [("cpu-float32", lambda: _scipy_eigh(m_cpu.to(torch.float32), "evd"))] if single else []
    attempts.append(("cpu", lambda: _torch_eigh(m_cpu)))
    attempts.append(("cpu-scipy-evr", lambda: _scipy_eigh(m_cpu)))
    scale = float(m_cpu.diagonal().abs().mean()) or 1.0
    for eps in (1e-12, 1e-9, 1e-6):
        attempts.append((f"cpu-shift-{eps:g}", _shifted(m_cpu, eps * scale)))
    return attempts


def _shifted(m: torch.Tensor, shift: float):
    def solve() -> tuple[torch.Tensor, torch.Tensor]:
        shifted = m.clone()
        shifted.diagonal().add_(shift)  # M + shift·I, formed only when this solver is tried
        values, vectors = _torch_eigh(shifted)
        return values - shift, vectors

    return solve
