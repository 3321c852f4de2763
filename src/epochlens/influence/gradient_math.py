"""The per-sample gradient arithmetic of the tracked layers, on tensors: a sample's gradient matrix
G = Σ_t ds_t a_tᵀ (:func:`per_sample_gradient`), formed in chunks of samples that fit a memory budget
(:func:`gradient_chunks`, :func:`chunk_bytes`), optionally rotated into an eigenbasis
(:func:`rotated_gradient`, and :func:`held_in_eigenbasis`: whether queries are held there), and the
blocked Gram products of K-FAC's covariances (:func:`gram_`, :func:`symmetrize_`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def per_sample_gradient(a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
    """G_n = Σ_t ds_{n,t} a_{n,t}ᵀ: (B, out, in_dim) from a (B, T, in_dim) and ds (B, T, out)."""
    if a.shape[1] == 1:
        return ds[:, 0, :, None] * a[:, 0, None, :]
    return torch.einsum("bto,bti->boi", ds, a)


#: Bytes of one layer's per-sample tensors that a pass forms at once, once for its unfolded inputs and
#: output gradients and once for per-sample gradient matrices: a batch is worked through in chunks of
#: samples that fit (:meth:`epochlens.influence.gradients.BatchBackprop.chunks`,
#: :func:`gradient_chunks`), so memory does not grow with the batch size or the largest layer's
#: out x in_dim. Sums over chunks equal the batch's up to rounding. On a CPU.
CHUNK_BYTES = 16 * 2**20
#: The same on an accelerator, where a chunk of one sample is a launch of small kernels per sample:
#: at 16 MiB ResNet-18's layer4 (18.9 MB a float64 gradient) went one sample at a time, and EK-FAC's
#: corrections, self-influence and pairwise passes took 2.5x, 3.4x and 2.5x their time at 256 MiB
#: (H200, N = 1,000, Q = 100, best of two interleaved runs).
ACCELERATOR_CHUNK_BYTES = 256 * 2**20


def chunk_bytes(device: torch.device | None = None) -> int:
    """The default chunk budget on ``device`` (a CPU's where None)."""
    return CHUNK_BYTES if device is None or device.type == "cpu" else ACCELERATOR_CHUNK_BYTES


def sample_chunks(
    n: int, per_sample_bytes: int, budget: int | None = None, device: torch.device | None = None
) -> list[slice]:
    """Consecutive slices of ``n`` samples, each of at most ``budget`` bytes (default
    :func:`chunk_bytes` of ``device``), at least one sample each; one empty slice for no sample."""
    step = max(1, (chunk_bytes(device) if budget is None else budget) // max(per_sample_bytes, 1))
    return [slice(start, min(start + step, n)) for start in range(0, max(n, 1), step)]


#: Columns per block of :func:`gram_`'s upper-triangle products (fastest on CPUs tried, 128-384).
GRAM_BLOCK = 256


def gram_(out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``out += aᵀ a`` on and above the diagonal only (a: (rows, d), out: (d, d)); see :func:`symmetrize_`.

    Block rows of the upper triangle, each one matrix product: (1 + 1/k)/2 of the full product's
    multiply-adds for k blocks (about 0.6 of the time of ``aᵀ a`` for ResNet-18's layers). The
    covariances of K-FAC are sums of such products over batches; they are mirrored once at the end.
    """
    d = a.shape[1]
    for start in range(0, d, GRAM_BLOCK):
        stop = min(start + GRAM_BLOCK, d)
        out[start:stop, start:].addmm_(a[:, start:stop].T, a[:, start:])
    return out


def symmetrize_(out: torch.Tensor) -> torch.Tensor:
    """Mirror the upper triangle of ``out`` (square) onto the lower one, in place, by blocks of
    :data:`GRAM_BLOCK` rows (3x faster than one transposed copy of a 4609² matrix)."""
    d = out.shape[0]
    for start in range(0, d, GRAM_BLOCK):
        stop = min(start + GRAM_BLOCK, d)
        out[start:stop, :start] = out[:start, start:stop].T
        diagonal = out[start:stop, start:stop]
        diagonal.copy_(diagonal.triu() + diagonal.triu(1).T)
    return out


def _rotate_first(t: int, n_out: int, n_in: int) -> bool:
    """Whether Σ_t (Q_Sᵀ ds_t)(Q_Aᵀ a_t)ᵀ is cheaper than rotating G_n = Σ_t ds_t a_tᵀ: T(in² + out² +
    out·in) per sample against T·out·in + out²·in + out·in² (30x less for ResNet-18's layer4: T = 16,
    in = 4609, out = 512; the other way round for its layer1, T = 1024)."""
    return t * (n_in * n_in + n_out * n_out + n_out * n_in) < t * n_out * n_in + n_out * n_in * (n_out + n_in)


def held_in_eigenbasis(t: int, n_out: int, n_in: int, n_train: int, n_queries: int) -> bool:
    """Whether pairwise scores of a layer cost less with the queries held in the eigenbasis, D Rᵀ G_q,
    each training gradient rotated into it (n_train · min(T(in² + out²), out·in·(out + in))
    multiply-adds beyond forming G_n, see :func:`_rotate_first`), than with P G_q, each query rotated
    back (n_queries · out·in·(out + in)). ResNet-18, 60 training images x 20 queries: its layer4
    (T = 16) held in the eigenbasis, its layer1 (T = 1,024) not; at 50,000 images neither."""
    back = n_out * n_in * (n_out + n_in)
    return n_train * min(t * (n_in * n_in + n_out * n_out), back) < n_queries * back


def rotated_gradient(a: torch.Tensor, ds: torch.Tensor, qs: torch.Tensor, qa: torch.Tensor) -> torch.Tensor:
    """Q_Sᵀ G_n Q_A (B, out, in_dim) for G_n = Σ_t ds_t a_tᵀ, without forming G_n where cheaper
    (see :func:`_rotate_first`). a: (B, T, in_dim), ds: (B, T, out), qs: (out, out), qa: (in_dim,
    in_dim), all one dtype."""
    if _rotate_first(a.shape[1], qs.shape[0], qa.shape[0]):
        return per_sample_gradient(a @ qa, ds @ qs)
    return qs.T @ per_sample_gradient(a, ds) @ qa


def gradient_chunks(
    a: torch.Tensor,
    ds: torch.Tensor,
    rot: tuple[torch.Tensor, torch.Tensor] | None = None,
    copies: int = 1,
    budget: int | None = None,
) -> Iterator[tuple[slice, torch.Tensor]]:
    """(samples, G) for consecutive chunks of the samples of a (B, T, in_dim) and ds (B, T, out):
    G the per-sample gradient matrices (b, out, in_dim), or Q_Sᵀ G Q_A with ``rot`` = (Q_S, Q_A)
    (:func:`rotated_gradient`, the same numbers).

    Each chunk holds at most ``budget`` bytes (default :func:`chunk_bytes` of a's device) of gradient
    matrices, ``copies`` of them per sample (G and what the caller forms from it at once), two more
    where the rotation runs after G. Where the rotation runs first it runs on the whole of a and ds, one large
    product each, not per chunk.
    """
    b, t, n_in = a.shape
    n_out = ds.shape[2]
    if rot is not None and _rotate_first(t, n_out, n_in):
        a, ds, rot = a @ rot[1], ds @ rot[0], None
    matrices = copies + (0 if rot is None else 2)
    for part in sample_chunks(b, matrices * n_out * n_in * a.element_size(), budget, a.device):
        g = per_sample_gradient(a[part], ds[part])
        yield part, g if rot is None else rot[0].T @ g @ rot[1]
