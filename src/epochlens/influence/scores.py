"""Influence scores: pairwise (queries x training samples) and self-influence, batched.

With g the gradient of a sample's loss (its own label; the per-sample cross-entropy over the
active classes, model in eval mode) with respect to the tracked layers' weights and biases, and
P = (G + λI)⁻¹ the damped inverse curvature of the mean training loss (block-diagonal over layers,
see :mod:`epochlens.influence.precondition`):

    pairwise[q, n] = g_qᵀ P g_n      self[n] = g_nᵀ P g_n

A positive pairwise score means that up-weighting training sample n lowers query q's loss (the
sample "helps" the query under the label the query is given; pass the predicted labels to ask
which samples support a prediction). Self-influence is >= 0; it is large for samples the model
finds surprising, such as mislabeled or poisoned ones.

Memory is bounded by batching: queries are preconditioned ``query_batch_size`` at a time
(query_batch_size x num_params numbers held), and for each query batch the training gradients are
recomputed ``train_batch_size`` at a time, one layer's matrices at a time. Pairwise costs
ceil(Q / query_batch_size) passes over the training set.

Samples with NaN/Inf gradients (or a non-finite solve) get NaN scores and are reported by global
index; samples whose label is not an active class get NaN and are not computed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens.device import model_device
from epochlens.errors import FactorCacheError
from epochlens.influence.factors import (
    InfluenceFactors,
    LayerFactors,
    _check_inputs,
    _report_skipped,
    check_active_classes,
    resolve_layers,
)
from epochlens.influence.gradients import (
    BatchBackprop,
    forward_backprop,
    prepare_model,
    resolve_compute_dtype,
)
from epochlens.influence.layers import ActivationCapture
from epochlens.influence.precondition import Preconditioner
from epochlens.influence.settings import InfluenceSettings
from epochlens.models.layers import check_finite_weights
from epochlens.models.networks import positions_in
from epochlens.progress import progress_bar


@dataclass
class PairwiseScores:
    """Pairwise influence.

    Attributes:
        scores: (Q, N) float64, scores[q, n] = g_qᵀ P g_n; NaN for skipped or inactive samples.
        query_skipped, train_skipped: int64 global indices of samples with NaN/Inf gradients.
        diagnostics: per-layer conditioning table (see :func:`factor_diagnostics`).
    """

    scores: np.ndarray
    query_skipped: np.ndarray
    train_skipped: np.ndarray
    diagnostics: pd.DataFrame


@dataclass
class SelfScores:
    """Self-influence.

    Attributes:
        scores: (N,) float64, g_nᵀ P g_n; NaN for skipped or inactive samples.
        losses: (N,) float64 per-sample cross-entropy (nats), NaN where not computed.
        skipped: int64 global indices of samples with NaN/Inf gradients or a non-finite solve.
        diagnostics: per-layer conditioning table.
    """

    scores: np.ndarray
    losses: np.ndarray
    skipped: np.ndarray
    diagnostics: pd.DataFrame


class _Engine:
    """A prepared model copy that yields per-sample backprops of batches (true labels)."""

    def __init__(
        self,
        model: nn.Module,
        settings: InfluenceSettings,
        active_classes: np.ndarray,
        device: str | torch.device | None,
        factors: InfluenceFactors | None,
    ) -> None:
        self.settings = settings
        self.active = check_active_classes(active_classes)
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
        dtype = resolve_compute_dtype(model, settings.compute_dtype)
        self.dtype = dtype
        self.net, self.layers = prepare_model(model, layers, self.device, dtype)
        check_finite_weights(self.net)
        self.active_idx = torch.as_tensor(self.active, device=self.device)
        self.pre = Preconditioner(factors, settings, self.device)

    def batches(
        self,
        images: torch.Tensor,
        labels: np.ndarray,
        indices: np.ndarray,
        batch_size: int,
        desc: str,
        progress: bool,
    ) -> Iterator[tuple[np.ndarray, BatchBackprop]]:
        """(rows, backprop) per batch; rows are positions in ``images`` with an active label."""
        targets = positions_in(labels, self.active)
        rows = np.flatnonzero(targets >= 0)
        bar = progress_bar(total=len(rows), unit="sample", disable=not progress, desc=desc, leave=False)
        with ActivationCapture(self.layers) as capture:
            for start in range(0, len(rows), batch_size):
                sel = rows[start : start + batch_size]
                x = images[torch.as_tensor(sel)].to(device=self.device, dtype=self.dtype)
                y = torch.as_tensor(targets[sel], device=self.device)
                bp = forward_backprop(self.net, capture, x, y, self.active_idx, "empirical", 0, indices[sel])
                yield sel, bp
                bar.update(len(sel))
        bar.close()

    def gradients(self, bp: BatchBackprop, name: str, ok: torch.Tensor) -> torch.Tensor:
        return bp.gradients(name, self.pre.dtype, rows=ok)[0]


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
    train_images: torch.Tensor | np.ndarray,
    train_labels: np.ndarray,
    query_images: torch.Tensor | np.ndarray,
    query_labels: np.ndarray,
    active_classes: np.ndarray,
    settings: InfluenceSettings | None = None,
    train_indices: np.ndarray | None = None,
    query_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> PairwiseScores:
    """Influence of every training sample on every query: scores (Q, N), g_qᵀ P g_n.

    Args:
        model: the checkpoint's model (a copy in eval mode is used).
        factors: fitted factors of this model (None for the identity method).
        train_images: (N, ...) normalised inputs; train_labels: (N,) class ids.
        query_images: (Q, ...); query_labels: (Q,) the labels whose loss the queries measure.
        active_classes: class ids the model was trained on.
        settings: damping, batch sizes, dtypes; default: the factors' method with default damping.
            Its layer selection must be the one the factors were fitted with.
        train_indices, query_indices: global indices for reports (default arange).
        device: compute device (None: the model's).
        progress: tqdm bars.

    Returns:
        :class:`PairwiseScores`.
    """
    settings = _settings(factors, settings)
    train_images, query_images = torch.as_tensor(train_images), torch.as_tensor(query_images)
    train_labels, query_labels = np.asarray(train_labels), np.asarray(query_labels)
    train_indices = np.arange(len(train_images)) if train_indices is None else np.asarray(train_indices)
    query_indices = np.arange(len(query_images)) if query_indices is None else np.asarray(query_indices)
    _check_inputs(train_images, train_labels, train_indices, "pairwise_influence (train)")
    _check_inputs(query_images, query_labels, query_indices, "pairwise_influence (queries)")
    eng = _Engine(model, settings, active_classes, device, factors)
    scores = np.full((len(query_images), len(train_images)), np.nan)
    q_skipped: list[int] = []
    n_skipped: list[int] = []
    first = True
    for qsel, qbp in eng.batches(
        query_images, query_labels, query_indices, settings.query_batch_size, "queries", progress
    ):
        ok_q = qbp.valid.clone()
        pq = {n: eng.pre.apply(n, *qbp.factored(n, eng.pre.dtype, rows=ok_q)[0]) for n in eng.layers}
        solved = torch.ones(int(ok_q.sum()), dtype=torch.bool, device=eng.device)
        for v in pq.values():
            solved &= torch.isfinite(v).flatten(1).all(1)
        if not bool(solved.all()):
            ok_q[ok_q.clone()] = solved
            pq = {n: v[solved] for n, v in pq.items()}
        ok_q_np = ok_q.cpu().numpy()
        q_skipped += query_indices[qsel][~ok_q_np].tolist()
        if not ok_q_np.any():
            continue
        for nsel, nbp in eng.batches(
            train_images, train_labels, train_indices, settings.train_batch_size, "train", progress
        ):
            ok_n = nbp.valid
            ok_n_np = ok_n.cpu().numpy()
            if first:
                n_skipped += train_indices[nsel][~ok_n_np].tolist()
            if not ok_n_np.any():
                continue
            block = None
            for n in eng.layers:
                part = torch.einsum("qoi,boi->qb", pq[n], eng.gradients(nbp, n, ok_n))
                block = part if block is None else block + part
            scores[np.ix_(qsel[ok_q_np], nsel[ok_n_np])] = block.cpu().to(torch.float64).numpy()
        first = False
    return PairwiseScores(
        scores,
        _report_skipped(q_skipped, "queries' scores"),
        _report_skipped(n_skipped, "training samples' scores"),
        eng.pre.diagnostics,
    )


def self_influence(
    model: nn.Module,
    factors: InfluenceFactors | None,
    images: torch.Tensor | np.ndarray,
    labels: np.ndarray,
    active_classes: np.ndarray,
    settings: InfluenceSettings | None = None,
    sample_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> SelfScores:
    """Self-influence g_nᵀ P g_n (N,) of every sample and its loss; arguments as in pairwise_influence."""
    settings = _settings(factors, settings)
    images, labels = torch.as_tensor(images), np.asarray(labels)
    sample_indices = np.arange(len(images)) if sample_indices is None else np.asarray(sample_indices)
    _check_inputs(images, labels, sample_indices, "self_influence")
    eng = _Engine(model, settings, active_classes, device, factors)
    scores = np.full(len(images), np.nan)
    losses = np.full(len(images), np.nan)
    skipped: list[int] = []
    for sel, bp in eng.batches(images, labels, sample_indices, settings.train_batch_size, "self", progress):
        ok = bp.valid
        total = torch.zeros(int(ok.sum()), dtype=eng.pre.dtype, device=eng.device)
        for n in eng.layers:
            total += eng.pre.quadratic(n, *bp.factored(n, eng.pre.dtype, rows=ok)[0])
        ok_np = ok.cpu().numpy()
        value = np.full(len(sel), np.nan)
        value[ok_np] = total.cpu().to(torch.float64).numpy()
        bad = ~np.isfinite(value)
        skipped += sample_indices[sel][bad].tolist()
        scores[sel] = value
        losses[sel] = bp.losses.cpu().numpy()
    return SelfScores(scores, losses, _report_skipped(skipped, "self-influence"), eng.pre.diagnostics)


def per_sample_gradients(
    model: nn.Module,
    images: torch.Tensor | np.ndarray,
    labels: np.ndarray,
    active_classes: np.ndarray,
    settings: InfluenceSettings | None = None,
    device: str | torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Per-sample loss gradients of the tracked layers: name -> (N, out, in_dim) float64 on the CPU.

    Column ``in_dim - 1`` is the bias where the layer has one (see
    :func:`epochlens.influence.layers.gradient_to_parameters`). Rows of samples with NaN/Inf
    gradients or an inactive label are NaN. Holds all N gradients: for small models and checks.
    """
    settings = settings or InfluenceSettings(method="identity")
    settings = replace(settings, method="identity", precondition_dtype="float64")
    images, labels = torch.as_tensor(images), np.asarray(labels)
    eng = _Engine(model, settings, active_classes, device, None)
    out = {
        n: torch.full((len(images), i.out_dim, i.in_dim), torch.nan, dtype=torch.float64)
        for n, i in eng.layers.items()
    }
    for sel, bp in eng.batches(
        images, labels, np.arange(len(images)), settings.train_batch_size, "grads", False
    ):
        ok = bp.valid
        rows = torch.as_tensor(sel[ok.cpu().numpy()])
        for n in eng.layers:
            out[n][rows] = eng.gradients(bp, n, ok).cpu()
    return out


def _per_checkpoint(active_classes, n_models: int) -> list[np.ndarray]:
    if isinstance(active_classes, (list, tuple)) and active_classes and not np.isscalar(active_classes[0]):
        if len(active_classes) != n_models:
            raise ValueError(f"{len(active_classes)} active-class sets for {n_models} checkpoints")
        return [np.asarray(a) for a in active_classes]
    return [np.asarray(active_classes)] * n_models


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
    train_images: torch.Tensor | np.ndarray,
    train_labels: np.ndarray,
    query_images: torch.Tensor | np.ndarray,
    query_labels: np.ndarray,
    active_classes: np.ndarray | Sequence[np.ndarray],
    settings: InfluenceSettings | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> PairwiseScores:
    """TracIn (Pruthi et al. 2020): Σ_k w_k g_q(θ_k)ᵀ g_n(θ_k) over checkpoints θ_k, (Q, N).

    ``weights`` are typically the learning rates at the checkpoints (None: all 1);
    ``active_classes`` is one set for all checkpoints or one per checkpoint. A sample skipped at
    any checkpoint is NaN.
    """
    weights = _check_weights(models, weights)
    actives = _per_checkpoint(active_classes, len(models))
    settings = replace(settings or InfluenceSettings(), method="identity")
    total, q_sk, n_sk = None, [], []
    for model, w, active in zip(models, weights, actives, strict=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = pairwise_influence(
                model,
                None,
                train_images,
                train_labels,
                query_images,
                query_labels,
                active,
                settings,
                device=device,
                progress=progress,
            )
        total = w * r.scores if total is None else total + w * r.scores
        q_sk += r.query_skipped.tolist()
        n_sk += r.train_skipped.tolist()
    return PairwiseScores(
        total,
        _report_skipped(q_sk, "TracIn queries"),
        _report_skipped(n_sk, "TracIn training samples"),
        pd.DataFrame(),
    )


def tracin_self(
    models: Sequence[nn.Module],
    weights: Sequence[float] | None,
    images: torch.Tensor | np.ndarray,
    labels: np.ndarray,
    active_classes: np.ndarray | Sequence[np.ndarray],
    settings: InfluenceSettings | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> SelfScores:
    """TracIn self-influence Σ_k w_k ‖g_n(θ_k)‖², (N,); losses are those of the last checkpoint."""
    weights = _check_weights(models, weights)
    actives = _per_checkpoint(active_classes, len(models))
    settings = replace(settings or InfluenceSettings(), method="identity")
    total, skipped, r = None, [], None
    for model, w, active in zip(models, weights, actives, strict=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = self_influence(
                model, None, images, labels, active, settings, device=device, progress=progress
            )
        total = w * r.scores if total is None else total + w * r.scores
        skipped += r.skipped.tolist()
    return SelfScores(total, r.losses, _report_skipped(skipped, "TracIn self-influence"), pd.DataFrame())
