"""The queries' preconditioned gradients held in memory (:class:`_QueryGradients`), filled batch by
batch and scored against the training set in passes whenever the store is full (:class:`_PairPasses`):
the memory rule and the per-layer choice of basis of :func:`epochlens.influence.scores.pairwise_influence`
(see its module doc). ``eng`` is that module's engine (model, layers, preconditioner, batches).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from epochlens.influence import gradient_math
from epochlens.influence.gradients import BatchBackprop
from epochlens.influence.layers import gradient_chunks, held_in_eigenbasis, layer_width, per_sample_gradient
from epochlens.influence.settings import InfluenceSettings


class _QueryGradients:
    """Preconditioned query gradients held for one pass over the training set, written into buffers
    allocated once (rows for the queries that fit in ``memory_gb``, or all of them): full or low rank.

    Per layer either P g_q (rows, out, in_dim), or D Rᵀ g_q (the same in the preconditioner's
    eigenbasis, :meth:`Preconditioner.apply_in_basis`) where :attr:`basis` says so (set by
    :func:`_choose_bases` before the first query is held), or (L (rows, out, r), R (rows, r, in_dim))
    with L R the best rank-r approximation of P g_q (truncated SVD).
    """

    def __init__(
        self, layers: dict, rank: int | None, dtype: torch.dtype, memory_gb: float, n_queries: int, device
    ) -> None:
        self.rank = rank
        self.positions: list[np.ndarray] = []
        self.low_rank = {
            n: rank is not None and rank * (i.out_dim + i.in_dim) < i.out_dim * i.in_dim
            for n, i in layers.items()
        }
        itemsize = torch.finfo(dtype).bits // 8
        per_query = sum(
            rank * (i.out_dim + i.in_dim) if self.low_rank[n] else i.out_dim * i.in_dim
            for n, i in layers.items()
        )
        self.bytes_per_query = per_query * itemsize
        self.capacity = max(1, min(int(memory_gb * 2**30 // max(self.bytes_per_query, 1)), n_queries))
        size, kw = self.capacity, {"dtype": dtype, "device": device}
        self.store = {
            n: (torch.empty(size, i.out_dim, rank, **kw), torch.empty(size, rank, i.in_dim, **kw))
            if self.low_rank[n]
            else torch.empty(size, i.out_dim, i.in_dim, **kw)
            for n, i in layers.items()
        }
        self.count = 0
        self.basis: dict[str, bool] | None = None

    def __len__(self) -> int:
        return self.count

    def write_low_rank(self, name: str, start: int, pg: torch.Tensor) -> None:
        """Store the rank-r factors of ``pg`` (B, out, in_dim) at rows ``start``.. of a low-rank layer
        (a full-rank layer's P g is written into :attr:`store` directly, see :func:`_hold_queries`)."""
        u, s, vh = torch.linalg.svd(pg, full_matrices=False)
        r, (left, right), stop = self.rank, self.store[name], start + len(pg)
        left[start:stop] = u[:, :, :r] * s[:, None, :r]
        right[start:stop] = vh[:, :r, :]

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor | tuple:
        """Held rows start..stop of layer ``name`` (views)."""
        held = self.store[name]
        return tuple(t[start:stop] for t in held) if isinstance(held, tuple) else held[start:stop]

    def finite(self, start: int, stop: int) -> torch.Tensor:
        """(stop - start,) bool: rows whose numbers are all finite in every layer."""
        ok = None
        for n in self.store:
            for t in self.rows(n, start, stop) if self.low_rank[n] else (self.rows(n, start, stop),):
                row_ok = torch.isfinite(t).flatten(1).all(1)
                ok = row_ok if ok is None else ok & row_ok
        return ok

    def keep(self, start: int, stop: int, ok: torch.Tensor) -> None:
        """Move the rows start..stop that ``ok`` keeps to start.. (in order)."""
        kept = int(ok.sum())
        for n in self.store:
            for t in self.store[n] if self.low_rank[n] else (self.store[n],):
                t[start : start + kept] = t[start:stop][ok]

    def add(self, positions: np.ndarray) -> None:
        """Count ``positions`` as held (their rows written at the end of the held ones)."""
        self.positions.append(positions)
        self.count += len(positions)

    def take(self) -> tuple[np.ndarray, dict]:
        """All held queries (positions, per-layer views of the store), and empty the store."""
        pos = np.concatenate(self.positions)
        out = {n: self.rows(n, 0, self.count) for n in self.store}
        self.positions.clear()
        self.count = 0
        return pos, out


def _hold_queries(eng, held: _QueryGradients, qbp: BatchBackprop, ok: torch.Tensor) -> torch.Tensor:
    """Write the preconditioned gradients of the batch's rows ``ok`` into ``held`` after its held rows,
    a chunk at a time (D Rᵀ g_q, or P g_q's rank-r factors); the rows whose numbers are finite in every
    layer are kept, in order. Returns that (B,) mask."""
    start, n_ok = len(held), int(ok.sum())
    for n in eng.layers:
        at = start
        for a, ds in eng.chunks(qbp, n, ok):
            if held.low_rank[n]:
                held.write_low_rank(n, at, eng.pre.apply(n, a, ds))
            else:
                apply = eng.pre.apply_in_basis if held.basis[n] else eng.pre.apply
                apply(n, a, ds, out=held.store[n][at : at + len(a)])
            at += len(a)
    solved = held.finite(start, start + n_ok)
    kept = ok.clone()
    if not bool(solved.all()):
        held.keep(start, start + n_ok, solved)
        kept[ok.clone()] = solved
    return kept


def _choose_bases(held: _QueryGradients, qbp: BatchBackprop, n_train: int, n_queries: int) -> None:
    """Per layer, whether the queries are held in the eigenbasis (:func:`held_in_eigenbasis`, T from
    the first batch of queries; ``n_queries`` those held in a pass)."""
    held.basis = {}
    for n, info in qbp.layers.items():
        t = sum(layer_width(info, x) for x in qbp.calls[n])
        held.basis[n] = held_in_eigenbasis(t, info.out_dim, info.in_dim, n_train, n_queries)


def _pair_block(held, in_basis: bool, eng, bp: BatchBackprop, name: str, ok: torch.Tensor) -> torch.Tensor:
    """(Q, B') scores of one layer for the held queries and the batch's usable samples: ⟨P g_q, g_n⟩,
    or ⟨D Rᵀ g_q, Rᵀ g_n⟩ where the queries are held ``in_basis``."""
    parts = []
    for a, ds in eng.chunks(bp, name, ok):
        if isinstance(held, tuple):  # low rank: <L R, Σ_t ds_t a_tᵀ> = Σ_t (Lᵀ ds_t)·(R a_t)
            parts.append(_low_rank_block(held, a, ds))
        else:
            budget = _pair_budget(held)
            grads = (
                eng.pre.in_basis(name, a, ds, budget) if in_basis else gradient_chunks(a, ds, budget=budget)
            )
            parts += [held.flatten(1) @ g.flatten(1).T for _, g in grads]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _pair_budget(held: torch.Tensor) -> int:
    """Bytes of a chunk of training gradients scored against a layer's held query rows at once: half
    the held rows' bytes, within [C, 8 x C] for C the device's chunk_bytes. Each chunk reads every held
    row once; a chunk of one sample makes that Q matrix-vector products, memory-bound (ResNet-18's layer4, 20
    queries, one CPU thread: 65 ms per sample at one sample a chunk, 10 ms at twelve)."""
    half = held.numel() * held.element_size() // 2
    base = gradient_math.chunk_bytes(held.device)
    return min(max(half, base), 8 * base)


def _low_rank_block(held: tuple, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
    """(Q, B') ⟨L_q R_q, G_n⟩ for G_n = Σ_t ds_t a_tᵀ, the cheaper way round."""
    left, right = held
    q, t = left.shape[0], a.shape[1]
    r, n_out, n_in = left.shape[2], left.shape[1], right.shape[2]
    if q * t * r * (n_out + n_in) <= t * n_out * n_in + q * n_out * n_in * r:
        pl = torch.einsum("qor,bto->qbtr", left, ds)
        pr = torch.einsum("qri,bti->qbtr", right, a)
        return (pl * pr).sum((2, 3))
    g = per_sample_gradient(a, ds)  # (B', out, in)
    gr = torch.einsum("boi,qri->qbor", g, right)
    return (gr * left[:, None]).sum((2, 3))


def _hold_batch(eng, held: _QueryGradients, qpos, qbp: BatchBackprop, score_held) -> torch.Tensor:
    """Hold the usable queries of a batch, scoring the training set (``score_held()``) whenever the
    store is full; the (B,) mask of the queries held."""
    usable = qbp.usable
    rows = torch.nonzero(usable).squeeze(1)
    kept = torch.zeros_like(usable)
    start = 0
    while start < len(rows):  # fill the store; score the training set whenever it is full
        part = rows[start : start + held.capacity - len(held)]
        some = torch.zeros_like(usable)
        some[part] = True
        some = _hold_queries(eng, held, qbp, some)
        held.add(qpos[some.cpu().numpy()])
        kept |= some
        start += len(part)
        if len(held) >= held.capacity:
            score_held()
    return kept


@dataclass
class _PairPasses:
    """The scores (Q, N) of :func:`pairwise_influence` as its passes over the training set fill them,
    and the samples skipped or vanished (the training samples' are counted on the first pass)."""

    scores: np.ndarray
    q_skipped: list[int] = field(default_factory=list)
    q_vanished: list[int] = field(default_factory=list)
    n_skipped: list[int] = field(default_factory=list)
    n_vanished: list[int] = field(default_factory=list)
    passes: int = 0

    def score_held(self, eng, held: _QueryGradients, train, settings: InfluenceSettings, progress) -> None:
        """One pass over the training set: the scores of the queries held, which it takes."""
        qpos, pq = held.take()
        for npos, nbp in eng.batches(train, settings.train_batch_size, "loss", "train", progress):
            ok_n = nbp.usable
            if self.passes == 0:
                self.n_skipped.extend(train.indices[npos][~nbp.valid.cpu().numpy()].tolist())
                self.n_vanished.extend(train.indices[npos][nbp.vanished.cpu().numpy()].tolist())
            ok_n_np = ok_n.cpu().numpy()
            if not ok_n_np.any():
                continue
            block = None
            for n in eng.layers:
                part = _pair_block(pq[n], held.basis[n], eng, nbp, n, ok_n)
                block = part if block is None else block + part
            self.scores[np.ix_(qpos, npos[ok_n_np])] = block.cpu().to(torch.float64).numpy()
        self.passes += 1
