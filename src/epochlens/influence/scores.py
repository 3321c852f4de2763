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
:func:`epochlens.influence.gradient_math.chunk_bytes` each (16 MiB on a CPU, 256 MiB on an
accelerator).

Samples with NaN/Inf gradients (or a non-finite solve) get NaN scores and are reported by global
index; samples whose gradients vanished in the compute dtype (underflow) get NaN and are reported
apart; samples the task cannot score (a label that is not an active class) get NaN and are not
computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from epochlens.batches import SampleSource
from epochlens.device import model_device
from epochlens.errors import FactorCacheError
from epochlens.influence.covariances import data_source, resolve_layers, resolve_task
from epochlens.influence.factors import InfluenceFactors, LayerFactors, _report_skipped, _report_vanished
from epochlens.influence.gradients import (
    BatchBackprop,
    Workspace,
    forward_backprop,
    prepared_model,
    resolve_compute_dtype,
    task_batches,
)
from epochlens.influence.held_queries import _choose_bases, _hold_batch, _PairPasses, _QueryGradients
from epochlens.influence.layers import (
    ActivationCapture,
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
    out = _PairPasses(np.full((len(queries), len(train)), np.nan))
    with _Engine(model, settings, task, device, factors) as eng:
        held = _QueryGradients(
            eng.layers,
            settings.query_gradient_rank,
            eng.pre.dtype,
            settings.query_memory_gb,
            len(queries),
            eng.device,
        )
        for qpos, qbp in eng.batches(queries, settings.query_batch_size, "measurement", "queries", progress):
            if held.basis is None:
                n_train = len(train) if train_total is None else train_total
                _choose_bases(held, qbp, n_train, min(held.capacity, len(queries)))
            out.q_vanished += queries.indices[qpos][qbp.vanished.cpu().numpy()].tolist()
            kept = _hold_batch(
                eng, held, qpos, qbp, lambda: out.score_held(eng, held, train, settings, progress)
            )
            bad = ~kept.cpu().numpy() & ~qbp.vanished.cpu().numpy()
            out.q_skipped += queries.indices[qpos][bad].tolist()
        if len(held):
            out.score_held(eng, held, train, settings, progress)
    dtype = eng.dtype
    return PairwiseScores(
        out.scores,
        _report_skipped(out.q_skipped, "queries' scores"),
        _report_skipped(out.n_skipped, "training samples' scores"),
        eng.pre.diagnostics,
        _report_vanished(out.q_vanished, "queries' scores", dtype),
        _report_vanished(out.n_vanished, "training samples' scores", dtype),
        out.passes,
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
