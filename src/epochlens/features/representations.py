"""Per-sample representations of one layer's activation, computed batch by batch.

An activation is a tensor (B, C, *spatial) for convolutional layers (usually (B, C, H, W)) or
(B, D) for fully connected ones. Every representation maps it to a matrix (B, dim):

* ``pooled``: global average over the spatial positions, (B, C); a (B, D) activation is kept as is.
* ``stats``: simple statistics of each sample's whole activation, (B, 6), in the order of
  :data:`STATS_COLUMNS`: mean, standard deviation (population), minimum, maximum, root mean square
  and the fraction of positive entries (the share of active ReLUs after a ReLU).
* ``spectral``: the top-k singular values of each sample's C x (H*W) matrix (channels by spatial
  positions), in descending order, (B, k). Where the matrix has rank below k (min(C, H*W) < k),
  the missing values are 0. A (B, D) activation is a 1 x D matrix: its one singular value is the
  Euclidean norm, followed by k - 1 zeros.

Spectral method (``RepresentationSettings.spectral_method``); the matrix is taken with its smaller
side first (m = min(C, H*W) rows, n = max columns), which leaves the singular values unchanged:

* ``gram``: square roots of the eigenvalues of the m x m Gram matrix A Aᵀ, formed and decomposed
  in float64 (float32 on MPS, which lacks float64). Exact to float32 output precision: the values
  agree with ``svdvals`` to 1e-7 of the largest one. Cost m²n + m³ per sample.
* ``exact``: ``torch.linalg.svdvals`` of the batch of matrices (float32).
* ``randomized``: the randomized range finder of Halko, Martinsson & Tropp (2011, Alg. 4.4; the
  algorithm of ``torch.svd_lowrank``) with q = k + oversample columns and ``spectral_iters``
  power iterations, then the exact singular values of the small q x n projection. Cost ~mnq per
  iteration, so it wins for large maps. Unlike ``torch.svd_lowrank``, which draws its Gaussian test
  matrix from the global random generator per call, the test matrix here is a pure function of
  (seed, matrix shape) and shared by every sample: a sample's values do not depend on the batch it
  is in, nor on the random state.
* ``auto`` (default): ``gram`` when m <= :data:`GRAM_MAX_SIDE` (128), else ``randomized``.

Measured on one CPU thread (AMD EPYC), batches of 64 post-ReLU random maps, k = 8 (ms per batch,
svdvals / gram / randomized with oversample 16 and 2 iterations): 64 x 1024: 121 / 28 / 74;
128 x 256: 100 / 46 / 29; 64 x 256: 47 / 24 / 21; 16 x 512: 6.6 / 1.5 / 12.6. Hence ``auto``:
every map of the digits CNN and of ResNet-18 on 32 x 32 inputs (m <= 128) goes to ``gram``;
larger maps (e.g. 256 x 3136 on ImageNet-size inputs) to ``randomized``.

The randomized values are lower bounds of the exact ones. On a randomly initialised ResNet-18
(layer1 64 x 1024 and layer2 128 x 256 maps, k = 8, 2 power iterations) the largest value agrees
to 1e-6 relative, the k-th is up to 1% low with oversample 16 (the default), 5% with oversample 8,
0.06% with oversample 16 and 4 iterations. Trained networks' spectra decay faster, which helps.
"""

from __future__ import annotations

import math

import torch

from epochlens.features.settings import RepresentationSettings

#: Largest smaller side of a matrix for which ``auto`` uses the Gram matrix (see module doc).
GRAM_MAX_SIDE = 128
STATS_COLUMNS = ("mean", "std", "min", "max", "rms", "frac_positive")


def as_matrix(act: torch.Tensor) -> torch.Tensor:
    """(B, C, *spatial) -> (B, C, prod(spatial)); (B, D) -> (B, 1, D)."""
    if act.ndim < 2:
        raise ValueError(f"activation must have a batch and a feature dimension, got {tuple(act.shape)}")
    if act.ndim == 2:
        return act.unsqueeze(1)
    return act.flatten(2)


def pooled(act: torch.Tensor) -> torch.Tensor:
    """Global average over spatial positions: (B, C, *spatial) -> (B, C); (B, D) unchanged."""
    return act if act.ndim == 2 else act.flatten(2).mean(2)


def simple_stats(act: torch.Tensor) -> torch.Tensor:
    """(B, 6) statistics of each sample's whole activation, columns :data:`STATS_COLUMNS`."""
    flat = act.flatten(1)
    mean = flat.mean(1)
    return torch.stack(
        [
            mean,
            flat.std(1, correction=0),
            flat.amin(1),
            flat.amax(1),
            flat.square().mean(1).sqrt(),
            (flat > 0).to(flat.dtype).mean(1),
        ],
        dim=1,
    )


def sketch_matrix(n: int, q: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Gaussian (n, q) test matrix, a pure function of (seed, n, q) (drawn on the CPU in float64)."""
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + n * 1009 + q)
    return torch.randn(n, q, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def randomized_svdvals(a: torch.Tensor, k: int, omega: torch.Tensor, n_iter: int = 2) -> torch.Tensor:
    """Approximate top-k singular values of a batch of matrices (B, m, n) with test matrix (n, q).

    Range finder with power iterations (re-orthonormalised by QR), then the exact singular values of
    Qᵀ A (B, q, n). Returns (B, min(k, q)) in descending order. Needs q >= k.
    """
    y = a @ omega  # (B, m, q)
    q_mat = torch.linalg.qr(y).Q
    for _ in range(n_iter):
        z = torch.linalg.qr(a.transpose(1, 2) @ q_mat).Q  # (B, n, q)
        q_mat = torch.linalg.qr(a @ z).Q  # (B, m, q)
    return torch.linalg.svdvals(q_mat.transpose(1, 2) @ a)[:, :k]


def spectral_method_for(shape: tuple[int, ...], settings: RepresentationSettings) -> str:
    """``gram``, ``exact`` or ``randomized`` for one sample's activation shape (C, *spatial) or (D,)."""
    if settings.spectral_method != "auto":
        return settings.spectral_method
    return "gram" if min(_matrix_dims(shape)) <= GRAM_MAX_SIDE else "randomized"


def gram_svdvals(a: torch.Tensor) -> torch.Tensor:
    """All singular values (B, m), descending, of matrices (B, m, n), m <= n, via eigenvalues of A Aᵀ.

    Float64 (float32 on MPS); rounding can make tiny eigenvalues negative: they are clipped to 0.
    """
    dtype = torch.float32 if a.device.type == "mps" else torch.float64
    w = a.to(dtype)
    eig = torch.linalg.eigvalsh(w @ w.transpose(1, 2))  # ascending
    return eig.flip(-1).clamp_min(0).sqrt().to(a.dtype)


def spectral(act: torch.Tensor, settings: RepresentationSettings) -> torch.Tensor:
    """(B, k) top singular values of each sample's C x (H*W) matrix, zero-padded beyond its rank."""
    mat = as_matrix(act)
    if mat.shape[1] > mat.shape[2]:  # smaller side first: same singular values, cheaper
        mat = mat.transpose(1, 2)
    work = mat if mat.dtype in (torch.float32, torch.float64) else mat.float()
    k, m, n = settings.spectral_k, work.shape[1], work.shape[2]
    method = spectral_method_for(tuple(act.shape[1:]), settings)
    if method == "gram":
        values = gram_svdvals(work)[:, :k]
    elif method == "exact":
        values = torch.linalg.svdvals(work)[:, :k]
    else:
        q = min(k + settings.spectral_oversample, m)  # a sketch wider than m adds nothing
        omega = sketch_matrix(n, q, settings.spectral_seed, work.dtype, work.device)
        values = randomized_svdvals(work, min(k, q), omega, settings.spectral_iters)
    if values.shape[1] < k:
        values = torch.nn.functional.pad(values, (0, k - values.shape[1]))
    return values


def compute(act: torch.Tensor, settings: RepresentationSettings) -> dict[str, torch.Tensor]:
    """Every representation in ``settings.names`` of a batch activation, each (B, dim), same device."""
    act = act.detach()
    if not act.is_floating_point():
        raise ValueError(f"activation must be a floating-point tensor, got {act.dtype}")
    out = {}
    for name in settings.names:
        if name == "pooled":
            out[name] = pooled(act)
        elif name == "stats":
            out[name] = simple_stats(act)
        else:
            out[name] = spectral(act, settings)
    return out


def dims(shape: tuple[int, ...], settings: RepresentationSettings) -> dict[str, int]:
    """Width of each representation for one sample's activation shape (C, *spatial) or (D,)."""
    widths = {"pooled": shape[0], "stats": len(STATS_COLUMNS), "spectral": settings.spectral_k}
    return {name: widths[name] for name in settings.names}


def _matrix_dims(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], math.prod(shape[1:])
