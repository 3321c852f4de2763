"""TracIn (Pruthi et al. 2020): the gradient dot product summed over checkpoints, Σ_k w_k g_q(θ_k)ᵀ g_n(θ_k).

:func:`tracin_pairwise`, :func:`tracin_self`: the sum over models at several checkpoints (the
influence engine of :mod:`epochlens.influence.scores` with method ``identity`` at each). Scores
computed per checkpoint are summed by :func:`epochlens.influence.accumulate.accumulate_tracin`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens.influence.covariances import resolve_task
from epochlens.influence.factors import _report_skipped
from epochlens.influence.scores import Data, PairwiseScores, SelfScores, pairwise_influence, self_influence
from epochlens.influence.settings import InfluenceSettings
from epochlens.tasks import Task


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
