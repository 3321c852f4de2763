"""The ``spectral`` representation: top-k singular values of each sample's C x (H*W) matrix
(:func:`spectral`; what it is: :mod:`epochlens.features.representations`).

Spectral method (``RepresentationSettings.spectral_method``); the matrix is taken with its smaller
side first (m = min(C, H*W) rows, n = max columns), which leaves the singular values unchanged:

* ``gram``: square roots of the top eigenvalues of the m x m Gram matrix A Aᵀ, formed in float64
  (float32 on MPS, which lacks float64). The values agree with ``svdvals`` in float64 to 1e-7 of
  each sample's largest one (tested, also for rank-deficient, zero, steeply decaying and flat
  spectra). Up to :data:`CPU_DIRECT_SIDE` (128, every map ``auto`` sends here) on the CPU, and
  up to :data:`RITZ_SIDE` (32) on a CUDA device, the Gram matrix is decomposed whole
  (``eigvalsh``; on the CPU each of torch's threads solves a share of the batch with one LAPACK
  thread, the values of the previous version to the bit). A larger one is first reduced to a
  24 x 24 Ritz matrix by block subspace iteration (:func:`subspace_ritz`): X ← orth(G² X) from a
  fixed Gaussian X₀ (m x 24), :data:`SUBSPACE_ITERS` = 6 steps, orthonormalised by shifted
  Cholesky QR (stable for any conditioning, rank-deficient blocks included), then the eigenvalues
  of Xᵀ G X.
  They are lower bounds of the exact ones; the i-th is off by about λ_i (λ_25 / λ_i)^(4 x 6):
  below 1e-8 relative for ResNet-18's 128 x 256 maps (λ_25 / λ_8 ~ 0.4), but ~1e-4 for a
  Gaussian matrix (~0.7). So the last step is checked: a sample whose top-k values moved by more
  than :data:`SUBSPACE_TOL` (1e-7) of its largest value in that step gets the exact eigenvalues of
  its Gram matrix (while the error shrinks by half or more per step, the change bounds it; where it
  shrinks more slowly, the change stays far above the tolerance until the error is small). On
  ResNet-18's 128 x 256 maps (random initialisation and inputs) 2 of 256 samples need it; a
  Gaussian matrix always does. On the CPU, 128 x 128 Gram matrices took 36 ms this way against
  57 ms for LAPACK's whole eigendecomposition (128 samples, one thread), but with the Gram
  product and the check counted, extraction was no faster, so the CPU keeps the exact path there.
* ``exact``: ``torch.linalg.svdvals`` of the batch of matrices (float32).
* ``randomized``: the randomized range finder of Halko, Martinsson & Tropp (2011, Alg. 4.4; the
  algorithm of ``torch.svd_lowrank``) with q = k + oversample columns and ``spectral_iters``
  power iterations, then the exact singular values of the small q x n projection. Cost ~mnq per
  iteration, so it wins for large maps. Unlike ``torch.svd_lowrank``, which draws its Gaussian test
  matrix from the global random generator per call, the test matrix here is a pure function of
  (seed, matrix shape) and shared by every sample: a sample's values do not depend on the batch it
  is in, nor on the random state.
* ``auto`` (default): ``gram`` when m <= :data:`GRAM_MAX_SIDE` (128), else ``randomized``.

On a GPU (``compute(..., deferred=True)``, the default on CUDA) nothing in a layer's hook runs
matrix by matrix or waits for the device: cuSOLVER solves a batched ``eigvalsh`` or ``svdvals`` of
matrices over 32 x 32 one matrix at a time, and every ``eigh``, ``svd`` and checked Cholesky
factorisation reads its error codes back to the host. ``gram`` and ``randomized`` therefore stop
at matrices of at most 32 x 32 (the Gram matrix itself, or the Ritz matrix; ``randomized``
orthonormalises by shifted Cholesky QR and keeps the Gram matrix of Qᵀ A), built from matrix
products, batched Cholesky factors and triangular solves; :func:`finish`, after the forward pass,
solves those of every layer of the batch in one batched ``eigvalsh`` (cuSOLVER's batched Jacobi
solver) and checks the subspace iteration's convergence: one wait for the device per batch, which
copying the features to the host needs anyway. Test matrices are cached on the device.
``exact`` stays ``svdvals`` (matrix by matrix). The deferred path gives the CPU path's values
(tested on the CPU, in ``tests/unit/features/test_representations.py``).

Measured on one CPU thread (AMD EPYC), batches of 64 post-ReLU random maps, k = 8 (ms per batch,
svdvals / gram / randomized with oversample 16 and 2 iterations):
64 x 1024: 121 / 28 / 74; 128 x 256: 100 / 46 / 29; 64 x 256: 47 / 24 / 21; 16 x 512: 6.6 / 1.5 /
12.6. Hence ``auto``: every map of the digits CNN and of ResNet-18 on 32 x 32 inputs (m <= 128)
goes to ``gram``; larger maps (e.g. 256 x 3136 on ImageNet-size inputs) to ``randomized``.

Cost within feature extraction (``benchmarks/features.py``: ResNet-18 on 32 x 32 random images,
random initialisation, every block output, 128 images per batch; one thread of the same CPU, ms
per batch against a forward pass of ~1,250-1,400 ms): ``stats`` 330 ms before, ~50 ms now (the
old ``std`` ran Welford's algorithm, the positive share summed a boolean copy); ``spectral`` (the
same values to the bit) 283-377 ms before, ~270-330 ms now: the float64 Gram matrices ~95-110 ms
(at the CPU's float64 peak; their float64 copies and results come from a :class:`Workspace`,
where fresh blocks had cost 33,000 page faults per batch), LAPACK's eigendecompositions 57 ms for
the four 64 x 64 ones and ~115 ms for the two 128 x 128 ones. With two threads each solves a
share of the batch with one LAPACK thread: LAPACK's own two threads had made the 128 x 128 ones
slower than one (80 ms against 63 ms for 128 matrices). Every representation together now costs
1.20-1.27x the extraction with ``pooled`` alone, with one or two threads (before: 1.51-1.84x);
README "Features on a CPU" has the command and the runs.

The randomized values are lower bounds of the exact ones. On a randomly initialised ResNet-18
(layer1 64 x 1024 and layer2 128 x 256 maps, k = 8, 2 power iterations) the largest value agrees
to 1e-6 relative, the k-th is up to 1% low with oversample 16 (the default), 5% with oversample 8,
0.06% with oversample 16 and 4 iterations. Trained networks' spectra decay faster, which helps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from epochlens.features.settings import RepresentationSettings
from epochlens.features.workspace import Workspace, per_matrix, sample_chunks, scratch

#: Largest smaller side of a matrix for which ``auto`` uses the Gram matrix (see module doc).
GRAM_MAX_SIDE = 128
#: Largest symmetric matrix that a GPU's batched eigensolver takes in one call (cuSOLVER's batched
#: Jacobi solver, which ``torch.linalg.eigvalsh`` uses up to 32 x 32; larger ones it solves one by one).
RITZ_SIDE = 32
#: Gram matrices up to this side are decomposed whole on the CPU (every map that ``auto`` sends to
#: ``gram``: LAPACK is about as fast as subspace iteration there, and exact), larger ones by
#: subspace iteration; on a GPU the side is :data:`RITZ_SIDE`.
CPU_DIRECT_SIDE = GRAM_MAX_SIDE
#: Columns of the block of subspace iteration (a Ritz matrix is this side, at most RITZ_SIDE), and
#: its steps with the squared Gram matrix (see module doc).
SUBSPACE_BLOCK = 24
SUBSPACE_ITERS = 6
#: Largest change of a top-k singular value in the last subspace step, relative to the largest
#: value, for which the iteration counts as converged; beyond it a sample gets exact eigenvalues.
SUBSPACE_TOL = 1e-7


def as_matrix(act: torch.Tensor) -> torch.Tensor:
    """(B, C, *spatial) -> (B, C, prod(spatial)); (B, D) -> (B, 1, D)."""
    if act.ndim < 2:
        raise ValueError(f"activation must have a batch and a feature dimension, got {tuple(act.shape)}")
    if act.ndim == 2:
        return act.unsqueeze(1)
    return act.flatten(2)


def sketch_matrix(n: int, q: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Gaussian (n, q) test matrix, a pure function of (seed, n, q) (drawn on the CPU in float64).

    Cached per (n, q, seed, dtype, device): a host-to-device copy per call would wait for the device.
    """
    return _sketch(int(n), int(q), int(seed), dtype, torch.device(device))


@lru_cache(maxsize=64)
def _sketch(n: int, q: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + n * 1009 + q)
    return torch.randn(n, q, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def randomized_svdvals(a: torch.Tensor, k: int, omega: torch.Tensor, n_iter: int = 2) -> torch.Tensor:
    """Approximate top-k singular values of a batch of matrices (B, m, n) with test matrix (n, q).

    Range finder with power iterations (re-orthonormalised by QR), then the exact singular values of
    Qᵀ A (B, q, n). Returns (B, min(k, q)) in descending order. Needs q >= k.
    """

    def orth(y: torch.Tensor) -> torch.Tensor:
        return per_matrix(lambda t: torch.linalg.qr(t).Q, y)

    q_mat = orth(a @ omega)  # (B, m, q)
    for _ in range(n_iter):
        z = orth(a.transpose(1, 2) @ q_mat)  # (B, n, q)
        q_mat = orth(a @ z)  # (B, m, q)
    return per_matrix(torch.linalg.svdvals, q_mat.transpose(1, 2) @ a)[:, :k]


def spectral_method_for(shape: tuple[int, ...], settings: RepresentationSettings) -> str:
    """``gram``, ``exact`` or ``randomized`` for one sample's activation shape (C, *spatial) or (D,)."""
    if settings.spectral_method != "auto":
        return settings.spectral_method
    return "gram" if min(_matrix_dims(shape)) <= GRAM_MAX_SIDE else "randomized"


def gram_matrices(
    a: torch.Tensor, workspace: Workspace | None = None, reuse_out: bool = False
) -> torch.Tensor:
    """A Aᵀ (B, m, m) of matrices (B, m, n), in float64 (float32 on MPS, which lacks float64).

    On the CPU, a float32 input is converted by chunks of samples (same values as at once), into
    ``workspace``'s buffer if given; ``reuse_out``: the result is one too (valid until the next
    call with this workspace).
    """
    dtype = torch.float32 if a.device.type == "mps" else torch.float64
    if a.dtype == dtype:
        return a @ a.transpose(1, 2)
    b, m, n = a.shape
    out = scratch(workspace if reuse_out else None, "gram", (b, m, m), a, dtype)
    for lo, hi in sample_chunks(a, m * n * torch.finfo(dtype).bits // 8):
        w = scratch(workspace, "gram_input", (hi - lo, m, n), a, dtype).copy_(a[lo:hi])
        torch.matmul(w, w.transpose(1, 2), out=out[lo:hi])
    return out


def gram_svdvals(a: torch.Tensor) -> torch.Tensor:
    """All singular values (B, m), descending, of matrices (B, m, n), m <= n, via eigenvalues of A Aᵀ.

    Float64 (float32 on MPS); rounding can make tiny eigenvalues negative: they are clipped to 0.
    """
    eig = per_matrix(torch.linalg.eigvalsh, gram_matrices(a))  # ascending
    return eig.flip(-1).clamp_min(0).sqrt().to(a.dtype)


@dataclass
class PendingSpectral:
    """Top-k singular values of a batch still to be read off small symmetric matrices (B, r, r)
    whose top eigenvalues are their squares: the Gram matrices, or their Ritz matrices after
    subspace iteration (then ``previous``, the Ritz matrices one step earlier, and ``gram``, for
    the convergence check of :func:`resolve`). :func:`finish` resolves every layer's at once."""

    matrix: torch.Tensor
    k: int
    dtype: torch.dtype = torch.float32
    previous: torch.Tensor | None = None
    gram: torch.Tensor | None = None


def gram_topk(
    a: torch.Tensor, k: int, seed: int = 0, deferred: bool = False, workspace: Workspace | None = None
) -> torch.Tensor | PendingSpectral:
    """Top-k singular values (B, k) of matrices (B, m, n), m <= n, from their Gram matrices.

    The Gram matrix is decomposed whole when m <= :data:`CPU_DIRECT_SIDE` on the CPU, m <=
    :data:`RITZ_SIDE` on a CUDA device or when ``deferred`` (always on other devices); beyond, it
    is first reduced to a Ritz matrix of side :data:`SUBSPACE_BLOCK` by :func:`subspace_ritz`.
    ``deferred``: return the :class:`PendingSpectral` instead of solving it (:func:`finish` solves
    a batch's at once). ``workspace``: scratch buffers (:class:`Workspace`).
    """
    g = gram_matrices(a, workspace, reuse_out=not deferred)  # solved before the next layer's
    m = g.shape[-1]
    whole = {"cpu": CPU_DIRECT_SIDE, "cuda": RITZ_SIDE}.get(a.device.type, m)  # MPS: whole
    if m <= (RITZ_SIDE if deferred else whole):
        pending = PendingSpectral(g, k, a.dtype)
    else:
        ritz = per_matrix(lambda c: subspace_ritz(c, SUBSPACE_BLOCK, SUBSPACE_ITERS, seed), g)
        pending = PendingSpectral(ritz[:, 0], k, a.dtype, previous=ritz[:, 1], gram=g)
    return pending if deferred else resolve([pending])[0]


def subspace_ritz(g: torch.Tensor, q: int, iters: int = SUBSPACE_ITERS, seed: int = 0) -> torch.Tensor:
    """Ritz matrices (B, 2, q, q) of symmetric positive semi-definite G (B, m, m), q < m: Xᵀ G X
    after ``iters`` steps and after ``iters - 1`` steps (for the convergence check).

    X (B, m, q) is an orthonormal basis of (G²)^iters X₀ for a Gaussian X₀ (m, q) that depends on
    (seed, m, q) only: block subspace iteration with the squared matrix, orthonormalised at every
    step by shifted Cholesky QR (:func:`orthonormal`). The eigenvalues of a Ritz matrix are lower
    bounds of the top q eigenvalues of G; the i-th (i <= k) is off by about
    λ_i (λ_{q+1} / λ_i)^(4 iters) (module doc). Matrix products, batched Cholesky factors and
    triangular solves only: nothing that a GPU runs matrix by matrix or that waits for it.
    """
    if iters < 2:
        raise ValueError(f"iters={iters}: subspace iteration needs at least 2 steps")
    x = sketch_matrix(g.shape[-1], q, seed, g.dtype, g.device)
    p = g @ g
    ritz = []
    for step in range(iters):
        x = orthonormal(p @ x)
        if step >= iters - 2:
            basis = orthonormal(x)  # a second pass: orthonormal to working precision
            ritz.append(basis.transpose(1, 2) @ g @ basis)
    return torch.stack(ritz[::-1], dim=1)


def orthonormal(y: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis (B, m, q) of the columns of y (B, m, q) by shifted Cholesky QR.

    R is the Cholesky factor of yᵀy + s I with s = 11 (mq + q(q+1)) u ||y||²_F (Fukaya et al.
    2020, shifted CholeskyQR), which exists for any y, rank-deficient or zero included; y R⁻¹ then
    has orthonormal columns up to u cond(y)², or columns of norm ~0 along directions that y lacks.
    Call it twice for a basis orthonormal to working precision.
    """
    m, q = y.shape[-2:]
    s = y.transpose(-2, -1) @ y
    finfo = torch.finfo(y.dtype)
    norm2 = s.diagonal(dim1=-2, dim2=-1).sum(-1)  # ||y||²_F
    shift = (11 * (m * q + q * (q + 1)) * finfo.eps * norm2).clamp_min(finfo.tiny)
    s = s + shift[..., None, None] * torch.eye(q, dtype=y.dtype, device=y.device)
    r, _ = torch.linalg.cholesky_ex(s, upper=True)  # no error check: it would wait for a GPU
    return torch.linalg.solve_triangular(r, y, upper=True, left=False)


def resolve(pending: list[PendingSpectral]) -> list[torch.Tensor]:
    """The (B, k) values of each :class:`PendingSpectral`, in its ``dtype``.

    Every matrix (and every ``previous`` one) is zero-padded to the largest side (zeros add
    eigenvalues 0, below every singular value's square) and solved by one batched ``eigvalsh``:
    on a GPU one call of the batched Jacobi solver (matrices up to 32 x 32). A sample whose
    subspace iteration has not converged (a top-k value moved by more than :data:`SUBSPACE_TOL`
    of the largest in the last step) gets the eigenvalues of its whole Gram matrix instead; on a
    GPU, deciding that waits for the device once.
    """
    mats = [p.matrix for p in pending] + [p.previous for p in pending if p.previous is not None]
    side = max(mat.shape[-1] for mat in mats)
    padded = [
        mat if mat.shape[-1] == side else torch.nn.functional.pad(mat, (0, side - mat.shape[-1]) * 2)
        for mat in mats
    ]
    stacked = padded[0] if len(padded) == 1 else torch.cat(padded)
    eig = per_matrix(torch.linalg.eigvalsh, stacked).flip(-1).clamp_min(0).sqrt()
    parts = iter(eig.split([len(mat) for mat in mats]))
    values = [next(parts)[:, : p.k] for p in pending]
    iterated = [i for i, p in enumerate(pending) if p.previous is not None and p.gram is not None]
    slow = {}
    for i in iterated:
        before = next(parts)[:, : pending[i].k]
        largest = values[i][:, 0].clamp_min(torch.finfo(eig.dtype).tiny)
        slow[i] = (values[i] - before).abs().amax(1) / largest > SUBSPACE_TOL
    if slow and torch.cat(list(slow.values())).any():  # on a GPU: the one wait, at the batch's end
        for i, flags in slow.items():
            rows = flags.nonzero().squeeze(1)
            if len(rows):
                gram = pending[i].gram[rows]  # type: ignore[index]
                exact = per_matrix(torch.linalg.eigvalsh, gram).flip(-1).clamp_min(0).sqrt()
                values[i] = values[i].index_copy(0, rows, exact[:, : pending[i].k])
    return [_pad(v.to(p.dtype), p.k) for v, p in zip(values, pending, strict=True)]


def spectral(
    act: torch.Tensor,
    settings: RepresentationSettings,
    deferred: bool = False,
    workspace: Workspace | None = None,
) -> torch.Tensor | PendingSpectral:
    """(B, k) top singular values of each sample's C x (H*W) matrix, zero-padded beyond its rank.

    ``deferred`` (what :func:`compute` does on a GPU): ``gram`` and ``randomized`` reduce each
    matrix to at most :data:`RITZ_SIDE` x :data:`RITZ_SIDE` with matrix products only and return a
    :class:`PendingSpectral` for :func:`finish` (module doc); ``exact`` is computed at once.
    """
    mat = as_matrix(act)
    if mat.shape[1] > mat.shape[2]:  # smaller side first: same singular values, cheaper
        mat = mat.transpose(1, 2)
    work = mat if mat.dtype in (torch.float32, torch.float64) else mat.float()
    k, m, n = settings.spectral_k, work.shape[1], work.shape[2]
    method = spectral_method_for(tuple(act.shape[1:]), settings)
    if method == "gram":
        return gram_topk(work, k, settings.spectral_seed, deferred, workspace)
    if method == "exact":
        return _pad(torch.linalg.svdvals(work)[:, :k], k)
    q = min(k + settings.spectral_oversample, m)  # a sketch wider than m adds nothing
    omega = sketch_matrix(n, q, settings.spectral_seed, work.dtype, work.device)
    if deferred:
        return PendingSpectral(_randomized_ritz(work, omega, settings.spectral_iters), k, work.dtype)
    return _pad(randomized_svdvals(work, min(k, q), omega, settings.spectral_iters), k)


def _randomized_ritz(a: torch.Tensor, omega: torch.Tensor, n_iter: int) -> torch.Tensor:
    """The randomized range finder of :func:`randomized_svdvals` as matrix products: orthonormal
    bases by shifted Cholesky QR in float64, and the Gram matrix (B, q, q) of Qᵀ A (float64), whose
    eigenvalues are the squares of Qᵀ A's singular values."""

    def orth(y: torch.Tensor) -> torch.Tensor:
        return orthonormal(orthonormal(y.double())).to(a.dtype)

    q_mat = orth(a @ omega)
    for _ in range(n_iter):
        q_mat = orth(a @ orth(a.transpose(1, 2) @ q_mat))
    c = (q_mat.transpose(1, 2) @ a).double()
    return c @ c.transpose(1, 2)


def _pad(values: torch.Tensor, k: int) -> torch.Tensor:
    if values.shape[1] < k:
        values = torch.nn.functional.pad(values, (0, k - values.shape[1]))
    return values


def _matrix_dims(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], math.prod(shape[1:])
