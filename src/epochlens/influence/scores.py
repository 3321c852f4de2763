"""Influence scores: pairwise (queries x training samples) and self-influence, batched.

With g the gradient of a sample's loss (its own targets; the task's per-sample loss, by default the
cross-entropy over the active classes, model in eval mode) with respect to the tracked layers'
weights and biases, g_q that of a query's measurement (the task's, by default its loss), and
P = (G + λI)⁻¹ the damped inverse curvature of the mean training loss (block-diagonal over layers,
see :mod:`epochlens.influence.precondition`):

    pairwise[q, n] = g_qᵀ P g_n      self[n] = g_nᵀ P g_n

A positive pairwise score means that up-weighting training sample n lowers query q's loss (the
sample "helps" the query under the label the query is given; pass the predicted labels to ask
which samples support a prediction). Self-influence is >= 0; it is large for samples the model
finds surprising, such as mislabeled or poisoned ones.

Pairwise cost and memory: every query's preconditioned gradient is computed first
(``query_batch_size`` at a time) and kept; then one pass over the training set computes each training
batch's gradients once, for all queries. Per layer the cheaper of two ways (from its shapes and the
numbers of training samples and held queries: :func:`~epochlens.influence.layers.held_in_eigenbasis`):
P g_q kept and ⟨P g_q, g_n⟩, or, where rotating every training gradient into the preconditioner's
eigenbasis costs less than rotating every query back out of it, D Rᵀ g_q kept (P = R D Rᵀ,
:meth:`~epochlens.influence.precondition.Preconditioner.apply_in_basis`) and ⟨D Rᵀ g_q, Rᵀ g_n⟩.
Memory rule: the kept gradients take Q x Σ_layers out·in_dim numbers of the precondition dtype
(8 bytes for float64; with ``query_gradient_rank`` r, Σ_layers min(out·in_dim, r·(out + in_dim)) per
query). When that exceeds ``query_memory_gb``, queries are processed in groups that fit, one training
pass per group. Example: ResNet-18 (11.2 M parameters) x 100 queries in float64 is 9 GB: five passes
with the default 2 GiB, or one pass with query_gradient_rank 32 (~50 MB, approximate scores). The kept
gradients are written into buffers allocated once (for the queries that fit, at most Q), chunk by
chunk as they are preconditioned; besides them a pass holds one batch's forward/backward (the
network's own tensors, compute dtype) and, layer by layer, chunks of per-sample tensors of at most
:func:`epochlens.influence.layers.chunk_bytes` each (16 MiB on a CPU, 256 MiB on an accelerator).

Samples with NaN/Inf gradients (or a non-finite solve) get NaN scores and are reported by global
index; samples whose gradients vanished in the compute dtype (underflow) get NaN and are reported
apart; samples the task cannot score (a label that is not an active class) get NaN and are not
computed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from epochlens.batches import SampleSource
from epochlens.device import model_device
from epochlens.errors import FactorCacheError
from epochlens.influence import layers as layer_math
from epochlens.influence.factors import (
    InfluenceFactors,
    LayerFactors,
    _report_skipped,
    _report_vanished,
    data_source,
    resolve_layers,
    resolve_task,
)
from epochlens.influence.gradients import (
    BatchBackprop,
    Workspace,
    forward_backprop,
    prepared_model,
    resolve_compute_dtype,
    task_batches,
)
from epochlens.influence.layers import (
    ActivationCapture,
    gradient_chunks,
    held_in_eigenbasis,
    layer_width,
    per_sample_gradient,
)
from epochlens.influence.precondition import Preconditioner
from epochlens.influence.settings import InfluenceSettings
from epochlens.progress import progress_bar
from epochlens.tasks import Task

Data = torch.Tensor | np.ndarray | Dataset | DataLoader


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class PairwiseScores:
    """Pairwise influence.

    Attributes:
        scores: (Q, N) float64, scores[q, n] = g_qᵀ P g_n; NaN for skipped, vanished or unscorable samples.
        query_skipped, train_skipped: int64 global indices of samples with NaN/Inf gradients.
        diagnostics: per-layer conditioning table (see :func:`factor_diagnostics`).
        query_underflow, train_underflow: int64 global indices of samples whose gradients vanished in
            the compute dtype (NaN scores, not 0).
        passes: passes over the training set (1 unless the queries did not fit in query_memory_gb).
    """

    scores: np.ndarray
    query_skipped: np.ndarray
    train_skipped: np.ndarray
    diagnostics: pd.DataFrame
    query_underflow: np.ndarray = field(default_factory=_empty)
    train_underflow: np.ndarray = field(default_factory=_empty)
    passes: int = 0


@dataclass
class SelfScores:
    """Self-influence.

    Attributes:
        scores: (N,) float64, g_nᵀ P g_n; NaN for skipped, vanished or unscorable samples.
        losses: (N,) float64 per-sample task loss (nats for cross-entropy), NaN where not computed.
        skipped: int64 global indices of samples with NaN/Inf gradients or a non-finite solve.
        diagnostics: per-layer conditioning table.
        underflow: int64 global indices of samples whose gradients vanished in the compute dtype.
    """

    scores: np.ndarray
    losses: np.ndarray
    skipped: np.ndarray
    diagnostics: pd.DataFrame
    underflow: np.ndarray = field(default_factory=_empty)


class _Engine:
    """The model prepared in place (restored on exit), hooks, preconditioner; yields batch backprops."""

    def __init__(
        self,
        model: nn.Module,
        settings: InfluenceSettings,
        task: Task,
        device: str | torch.device | None,
        factors: InfluenceFactors | None,
    ) -> None:
        self.settings, self.task, self.model = settings, task, model
        layers = resolve_layers(model, settings)
        if factors is not None and list(factors.layers) != list(layers):
            raise _mismatch(list(factors.layers), list(layers))
        if factors is None:
            if settings.method != "identity":
                raise ValueError(f"method {settings.method!r} needs fitted factors (see fit_factors)")
            factors = InfluenceFactors(
                "identity",
                settings.fisher,
                {n: LayerFactors(n, i.kind, i.out_dim, i.in_dim, i.has_bias) for n, i in layers.items()},
                np.zeros(0, np.int64),
                0,
            )
        self.device = model_device(model, device)
        self.dtype = resolve_compute_dtype(model, settings.compute_dtype)
        self.layers = layers
        notes = {n: i.note for n, i in layers.items() if i.note}
        self.pre = Preconditioner(factors, settings, self.device, self.dtype, notes)
        self.workspace = Workspace()

    def __enter__(self) -> _Engine:
        self._prepared = prepared_model(self.model, self.layers, self.device, self.dtype)
        self.net = self._prepared.__enter__()
        self.capture = ActivationCapture(self.layers).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.capture.__exit__(*exc)
        self._prepared.__exit__(*exc)

    def batches(
        self, source: SampleSource, batch_size: int, mode: str, desc: str, progress: bool
    ) -> Iterator[tuple[np.ndarray, BatchBackprop]]:
        """(positions in ``source``, backprop) per batch of scorable samples."""
        bar = progress_bar(total=len(source), unit="sample", disable=not progress, desc=desc, leave=False)
        for pos, inputs, targets in task_batches(source, self.task, batch_size, self.device, self.dtype):
            bp = forward_backprop(
                self.net, self.capture, self.task, inputs, targets, mode, 0, source.indices[pos]
            )
            yield pos, bp
            bar.update(len(pos))
        bar.close()

    def gradients(self, bp: BatchBackprop, name: str, ok: torch.Tensor) -> torch.Tensor:
        return bp.gradients(name, self.pre.dtype, rows=ok)[0]

    def chunks(self, bp: BatchBackprop, name: str, ok: torch.Tensor):
        """(a, ds) of layer ``name``'s usable rows in the precondition dtype, a chunk of samples at a
        time (room left for rotated copies: see :meth:`BatchBackprop.chunks`)."""
        for a, ds in bp.chunks(name, self.pre.dtype, ok, copies=2, workspace=self.workspace):
            yield a, ds[0]

    def quadratic(self, bp: BatchBackprop, name: str, ok: torch.Tensor) -> torch.Tensor:
        """(B',) Gᵀ P G of layer ``name`` for the batch's usable rows."""
        parts = [self.pre.quadratic(name, a, ds) for a, ds in self.chunks(bp, name, ok)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _mismatch(fitted: list[str], now: list[str]) -> Exception:
    return FactorCacheError(
        f"the factors were fitted on layers {_short(fitted)} but the settings select {_short(now)}; use "
        "the factors' own settings (factors.settings(...)) or fit factors for this layer selection."
    )


def _short(names: list[str], n: int = 6) -> str:
    return str(names) if len(names) <= n else f"{names[:n]} and {len(names) - n} more"


def _settings(factors: InfluenceFactors | None, settings: InfluenceSettings | None) -> InfluenceSettings:
    if settings is not None:
        return settings
    if factors is None:
        return InfluenceSettings(method="identity")
    return factors.settings()


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


def _hold_queries(eng: _Engine, held: _QueryGradients, qbp: BatchBackprop, ok: torch.Tensor) -> torch.Tensor:
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


def _pair_block(
    held, in_basis: bool, eng: _Engine, bp: BatchBackprop, name: str, ok: torch.Tensor
) -> torch.Tensor:
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
    base = layer_math.chunk_bytes(held.device)
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


def pairwise_influence(
    model: nn.Module,
    factors: InfluenceFactors | None,
    train_images: Data,
    train_labels: np.ndarray | torch.Tensor | None = None,
    query_images: Data | None = None,
    query_labels: np.ndarray | torch.Tensor | None = None,
    active_classes: np.ndarray | None = None,
    settings: InfluenceSettings | None = None,
    train_indices: np.ndarray | None = None,
    query_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    task: Task | str | None = None,
    train_total: int | None = None,
) -> PairwiseScores:
    """Influence of every training sample on every query: scores (Q, N), g_qᵀ P g_n.

    Args:
        model: the checkpoint's model (used in place, in eval mode; restored afterwards).
        factors: fitted factors of this model (None for the identity method).
        train_images: (N, ...) in-memory inputs, or a Dataset/DataLoader (then train_labels None).
        train_labels: (N,) targets of in-memory inputs (class ids for classification).
        query_images, query_labels: the queries, likewise; the labels (targets) are those whose
            loss (the task's measurement) the queries measure.
        active_classes: class ids of a classification task (None: all); ignored with ``task``.
        settings: damping, batch sizes, query memory, dtypes; default: the factors' method with default
            damping. Its layer selection must be the one the factors were fitted with.
        train_indices, query_indices: global indices for reports (default arange).
        device: compute device (None: the model's).
        progress: tqdm bars.
        task: the loss (see :mod:`epochlens.tasks`); None: classification over ``active_classes``.
        train_total: the training samples of the whole pass when these are one shard of it (None:
            these): each layer's way of holding the queries (:func:`held_in_eigenbasis`) is chosen
            for it, so that every shard computes as the unsharded pass does, to the bit.

    Returns:
        :class:`PairwiseScores`.
    """
    settings = _settings(factors, settings)
    task = resolve_task(task, active_classes)
    if query_images is None:
        raise ValueError("pairwise_influence needs queries (query_images)")
    train = data_source(train_images, train_labels, train_indices, task, "pairwise_influence (train)")
    queries = data_source(query_images, query_labels, query_indices, task, "pairwise_influence (queries)")
    scores = np.full((len(queries), len(train)), np.nan)
    q_skipped: list[int] = []
    q_vanished: list[int] = []
    n_skipped: list[int] = []
    n_vanished: list[int] = []
    passes = 0
    with _Engine(model, settings, task, device, factors) as eng:
        held = _QueryGradients(
            eng.layers,
            settings.query_gradient_rank,
            eng.pre.dtype,
            settings.query_memory_gb,
            len(queries),
            eng.device,
        )

        def score_held() -> None:
            nonlocal passes
            qpos, pq = held.take()
            for npos, nbp in eng.batches(train, settings.train_batch_size, "loss", "train", progress):
                ok_n = nbp.usable
                if passes == 0:
                    n_skipped.extend(train.indices[npos][~nbp.valid.cpu().numpy()].tolist())
                    n_vanished.extend(train.indices[npos][nbp.vanished.cpu().numpy()].tolist())
                ok_n_np = ok_n.cpu().numpy()
                if not ok_n_np.any():
                    continue
                block = None
                for n in eng.layers:
                    part = _pair_block(pq[n], held.basis[n], eng, nbp, n, ok_n)
                    block = part if block is None else block + part
                scores[np.ix_(qpos, npos[ok_n_np])] = block.cpu().to(torch.float64).numpy()
            passes += 1

        for qpos, qbp in eng.batches(queries, settings.query_batch_size, "measurement", "queries", progress):
            usable = qbp.usable
            if held.basis is None:
                n_train = len(train) if train_total is None else train_total
                _choose_bases(held, qbp, n_train, min(held.capacity, len(queries)))
            q_vanished += queries.indices[qpos][qbp.vanished.cpu().numpy()].tolist()
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
            bad = ~kept.cpu().numpy() & ~qbp.vanished.cpu().numpy()
            q_skipped += queries.indices[qpos][bad].tolist()
        if len(held):
            score_held()
    dtype = eng.dtype
    return PairwiseScores(
        scores,
        _report_skipped(q_skipped, "queries' scores"),
        _report_skipped(n_skipped, "training samples' scores"),
        eng.pre.diagnostics,
        _report_vanished(q_vanished, "queries' scores", dtype),
        _report_vanished(n_vanished, "training samples' scores", dtype),
        passes,
    )


def self_influence(
    model: nn.Module,
    factors: InfluenceFactors | None,
    images: Data,
    labels: np.ndarray | torch.Tensor | None = None,
    active_classes: np.ndarray | None = None,
    settings: InfluenceSettings | None = None,
    sample_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    task: Task | str | None = None,
) -> SelfScores:
    """Self-influence g_nᵀ P g_n (N,) of every sample and its loss; arguments as in pairwise_influence."""
    settings = _settings(factors, settings)
    task = resolve_task(task, active_classes)
    source = data_source(images, labels, sample_indices, task, "self_influence")
    scores = np.full(len(source), np.nan)
    losses = np.full(len(source), np.nan)
    skipped: list[int] = []
    vanished: list[int] = []
    with _Engine(model, settings, task, device, factors) as eng:
        for pos, bp in eng.batches(source, settings.train_batch_size, "loss", "self", progress):
            ok = bp.usable
            total = torch.zeros(int(ok.sum()), dtype=eng.pre.dtype, device=eng.device)
            for n in eng.layers:
                total += eng.quadratic(bp, n, ok)
            ok_np = ok.cpu().numpy()
            gone = bp.vanished.cpu().numpy()
            value = np.full(len(pos), np.nan)
            value[ok_np] = total.cpu().to(torch.float64).numpy()
            bad = ~np.isfinite(value) & ~gone
            skipped += source.indices[pos][bad].tolist()
            vanished += source.indices[pos][gone].tolist()
            scores[pos] = value
            losses[pos] = bp.losses.cpu().numpy()
    return SelfScores(
        scores,
        losses,
        _report_skipped(skipped, "self-influence"),
        eng.pre.diagnostics,
        _report_vanished(vanished, "self-influence", eng.dtype),
    )


def per_sample_gradients(
    model: nn.Module,
    images: Data,
    labels: np.ndarray | torch.Tensor | None = None,
    active_classes: np.ndarray | None = None,
    settings: InfluenceSettings | None = None,
    device: str | torch.device | None = None,
    task: Task | str | None = None,
) -> dict[str, torch.Tensor]:
    """Per-sample loss gradients of the tracked layers: name -> (N, out, in_dim) float64 on the CPU.

    Column ``in_dim - 1`` is the bias where the layer has one (see
    :func:`epochlens.influence.layers.gradient_to_parameters`). Rows of samples with NaN/Inf or
    vanished gradients, or that the task cannot score, are NaN. Holds all N gradients: for small
    models and checks.
    """
    settings = settings or InfluenceSettings(method="identity")
    settings = replace(settings, method="identity", precondition_dtype="float64")
    task = resolve_task(task, active_classes)
    source = data_source(images, labels, None, task, "per_sample_gradients")
    with _Engine(model, settings, task, device, None) as eng:
        out = {
            n: torch.full((len(source), i.out_dim, i.in_dim), torch.nan, dtype=torch.float64)
            for n, i in eng.layers.items()
        }
        for pos, bp in eng.batches(source, settings.train_batch_size, "loss", "grads", False):
            ok = bp.usable
            rows = torch.as_tensor(pos[ok.cpu().numpy()])
            for n in eng.layers:
                out[n][rows] = eng.gradients(bp, n, ok).cpu()
    return out


def _per_checkpoint(active_classes, n_models: int) -> list[np.ndarray | None]:
    if active_classes is None:
        return [None] * n_models
    if isinstance(active_classes, (list, tuple)) and active_classes and not np.isscalar(active_classes[0]):
        if len(active_classes) != n_models:
            raise ValueError(f"{len(active_classes)} active-class sets for {n_models} checkpoints")
        return [np.asarray(a) for a in active_classes]
    return [np.asarray(active_classes)] * n_models


def _per_checkpoint_tasks(task, actives: list) -> list:
    if task is None:
        return [resolve_task(None, a) for a in actives]
    if isinstance(task, (list, tuple)):
        if len(task) != len(actives):
            raise ValueError(f"{len(task)} tasks for {len(actives)} checkpoints")
        return list(task)
    return [task] * len(actives)


def _check_weights(models: Sequence[nn.Module], weights: Sequence[float] | None) -> list[float]:
    if not models:
        raise ValueError("TracIn needs at least one checkpoint")
    weights = [1.0] * len(models) if weights is None else [float(w) for w in weights]
    if len(weights) != len(models) or not all(np.isfinite(weights)):
        raise ValueError(f"need one finite weight per checkpoint, got {weights} for {len(models)}")
    return weights


def tracin_pairwise(
    models: Sequence[nn.Module],
    weights: Sequence[float] | None,
    train_images: Data,
    train_labels: np.ndarray | None,
    query_images: Data,
    query_labels: np.ndarray | None,
    active_classes: np.ndarray | Sequence[np.ndarray] | None = None,
    settings: InfluenceSettings | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    task: Task | str | Sequence[Task] | None = None,
) -> PairwiseScores:
    """TracIn (Pruthi et al. 2020): Σ_k w_k g_q(θ_k)ᵀ g_n(θ_k) over checkpoints θ_k, (Q, N).

    ``weights`` are typically the learning rates at the checkpoints (None: all 1);
    ``active_classes`` is one set for all checkpoints or one per checkpoint (classification), or
    ``task`` one task or one per checkpoint. A sample skipped at any checkpoint is NaN.
    """
    weights = _check_weights(models, weights)
    tasks = _per_checkpoint_tasks(task, _per_checkpoint(active_classes, len(models)))
    settings = replace(settings or InfluenceSettings(), method="identity")
    total, q_sk, n_sk, q_uf, n_uf = None, [], [], [], []
    for model, w, t in zip(models, weights, tasks, strict=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = pairwise_influence(
                model,
                None,
                train_images,
                train_labels,
                query_images,
                query_labels,
                None,
                settings,
                device=device,
                progress=progress,
                task=t,
            )
        total = w * r.scores if total is None else total + w * r.scores
        q_sk += r.query_skipped.tolist()
        n_sk += r.train_skipped.tolist()
        q_uf += r.query_underflow.tolist()
        n_uf += r.train_underflow.tolist()
    return PairwiseScores(
        total,
        _report_skipped(q_sk, "TracIn queries"),
        _report_skipped(n_sk, "TracIn training samples"),
        pd.DataFrame(),
        np.asarray(sorted(set(q_uf)), np.int64),
        np.asarray(sorted(set(n_uf)), np.int64),
    )


def tracin_self(
    models: Sequence[nn.Module],
    weights: Sequence[float] | None,
    images: Data,
    labels: np.ndarray | None,
    active_classes: np.ndarray | Sequence[np.ndarray] | None = None,
    settings: InfluenceSettings | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    task: Task | str | Sequence[Task] | None = None,
) -> SelfScores:
    """TracIn self-influence Σ_k w_k ‖g_n(θ_k)‖², (N,); losses are those of the last checkpoint."""
    weights = _check_weights(models, weights)
    tasks = _per_checkpoint_tasks(task, _per_checkpoint(active_classes, len(models)))
    settings = replace(settings or InfluenceSettings(), method="identity")
    total, skipped, underflow, r = None, [], [], None
    for model, w, t in zip(models, weights, tasks, strict=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = self_influence(
                model, None, images, labels, None, settings, device=device, progress=progress, task=t
            )
        total = w * r.scores if total is None else total + w * r.scores
        skipped += r.skipped.tolist()
        underflow += r.underflow.tolist()
    return SelfScores(
        total,
        r.losses,
        _report_skipped(skipped, "TracIn self-influence"),
        pd.DataFrame(),
        np.asarray(sorted(set(underflow)), np.int64),
    )
