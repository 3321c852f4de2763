"""The data-quality study around the influence engine: queries, TracIn over a class schedule, signals.

A run trains on a training set of which some images were corrupted on purpose
(:mod:`epochlens.study.corruption`); at a checkpoint, influence scores rank the training images, and
:mod:`epochlens.study.detection` measures how well each ranking finds the corrupted ones. This module
holds the steps between the two:

* :func:`select_queries`: the test images whose predictions are attributed (by default those the
  checkpoint gets wrong, scored under the predicted label), optionally with the trigger patch of a
  backdoor study stamped on them;
* :func:`accumulate_tracin`: TracIn's sum over checkpoints where each image counts only at the
  checkpoints at which its class had been trained (class-incremental schedules);
* :func:`study_signals`: the per-image signals of one method (self-influence, influence on the
  queries under each query transform, reduced over the queries by :func:`reduce_query_influence`);
* :func:`roc_table`, :func:`top_ranked`: tidy tables behind the ROC and top-images figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_curve
from torch import nn

from epochlens.data import Dataset
from epochlens.errors import ConfigError
from epochlens.influence.settings import InfluenceSettings
from epochlens.models.networks import restrict_logits
from epochlens.study.corruption import apply_trigger, trigger_value
from epochlens.study.detection import query_signal
from epochlens.study.settings import QUERY_LABELS, QUERY_REDUCTIONS, QUERY_SELECTIONS


@dataclasses.dataclass
class QuerySet:
    """Queries of the influence study.

    Attributes:
        test_indices: (Q,) int64 positions in the test split.
        images: (Q, C, H, W) float32 normalised images (trigger stamped where ``triggered``).
        labels: (Q,) int64 labels whose loss each query measures (predicted or correct).
        true_labels, predicted: (Q,) int64 the test set's labels and the checkpoint's predictions.
        triggered: whether the trigger patch was stamped on the queries.
        sign: +1 when the labels are the predictions (images that push a wrong prediction have
            positive influence), -1 for the correct labels; see
            :func:`epochlens.study.detection.query_signal`.
        candidates: test images that qualified before the ``max_count`` subset.
    """

    test_indices: np.ndarray
    images: torch.Tensor
    labels: np.ndarray
    true_labels: np.ndarray
    predicted: np.ndarray
    triggered: bool
    sign: float
    candidates: int


@torch.no_grad()
def predict(
    model: nn.Module,
    images: torch.Tensor,
    active_classes: np.ndarray,
    device: torch.device,
    batch_size: int = 512,
) -> np.ndarray:
    """Predicted class ids (N,) int64 among ``active_classes`` (restricted logits, eval mode)."""
    was_training = model.training
    model.eval().to(device)
    active = np.asarray(active_classes, np.int64)
    out = []
    for start in range(0, len(images), batch_size):
        logits = restrict_logits(model(images[start : start + batch_size].to(device)), active)
        out.append(active[logits.argmax(1).cpu().numpy()])
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def select_queries(
    model: nn.Module,
    data: Dataset,
    active_classes: np.ndarray,
    device: torch.device,
    select: str = "misclassified",
    max_count: int = 50,
    labels: str = "correct",
    seed: int = 0,
    trigger: Mapping | None = None,
) -> QuerySet:
    """The test images to attribute, and the labels they are scored under.

    Args:
        model: the checkpoint's model.
        data: the run's data set (its test split).
        active_classes: classes the checkpoint was trained on; only their test images qualify.
        device: where the forward pass runs.
        select: ``misclassified`` (the checkpoint's prediction differs from the label) or ``all``.
        max_count: at most this many queries: a seeded subset (sorted) when more qualify.
        labels: ``correct`` (the test set's label: training images with negative influence raise
            the query's loss, the "harmful" images of Koh & Liang 2017) or ``predicted`` (images with
            positive influence support the prediction, e.g. a backdoor's target).
        seed: seed of the subset.
        trigger: ``{"target_class", "patch_size", "corner"}`` to stamp the backdoor's patch on the
            test images of the other active classes (the target's own images do not qualify); None:
            the images as they are.

    Returns:
        :class:`QuerySet` (possibly empty: a checkpoint without mistakes has no misclassified queries).
    """
    if select not in QUERY_SELECTIONS:
        raise ConfigError(f"queries.select={select!r} must be one of {list(QUERY_SELECTIONS)}")
    if labels not in QUERY_LABELS:
        raise ConfigError(f"queries.labels={labels!r} must be one of {list(QUERY_LABELS)}")
    active = np.asarray(active_classes, np.int64)
    eligible = np.isin(data.test_labels, active)
    if trigger is not None:
        target = int(trigger["target_class"])
        if target not in active:
            raise ConfigError(
                f"queries with a trigger: target class {target} is not trained at this checkpoint "
                f"(active classes {active.tolist()}); pick a later influence epoch or set "
                "queries.trigger: false."
            )
        eligible &= data.test_labels != target
        stamped = apply_trigger(
            data.test_images, int(trigger["patch_size"]), trigger["corner"], trigger_value(data)
        )
        data = dataclasses.replace(data, test_images=stamped)
    candidates = np.flatnonzero(eligible)
    images = data.normalized("test", candidates)
    predicted = predict(model, images, active, device)
    true = data.test_labels[candidates]
    keep = predicted != true if select == "misclassified" else np.ones(len(candidates), bool)
    rows = np.flatnonzero(keep)
    n_qualified = len(rows)
    if len(rows) > max_count:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_count, replace=False))
    return QuerySet(
        test_indices=candidates[rows].astype(np.int64),
        images=images[torch.as_tensor(rows, dtype=torch.long)],
        labels=(predicted if labels == "predicted" else true)[rows].astype(np.int64),
        true_labels=true[rows].astype(np.int64),
        predicted=predicted[rows].astype(np.int64),
        triggered=trigger is not None,
        sign=1.0 if labels == "predicted" else -1.0,
        candidates=n_qualified,
    )


def accumulate_tracin(parts: list[np.ndarray], weights: list[float] | None = None) -> np.ndarray:
    """Σ_k w_k parts[k] where each entry counts only at the checkpoints where it is finite.

    In a class-incremental run an image (or a query's label) is not trained before its class is
    added: its score at those checkpoints is NaN and contributes nothing, as in TracIn's sum over
    the steps that trained on it. Entries NaN at every checkpoint stay NaN.
    """
    if not parts:
        raise ValueError("TracIn needs at least one checkpoint")
    weights = [1.0] * len(parts) if weights is None else list(weights)
    stack = np.stack([np.asarray(p, np.float64) * w for p, w in zip(parts, weights, strict=True)])
    finite = np.isfinite(stack)
    total = np.where(finite, stack, 0.0).sum(0)
    return np.where(finite.any(0), total, np.nan)


def query_signal_name(transform: str) -> str:
    """Name of the query-influence signal under a query transform (``query_influence`` for none)."""
    return "query_influence" if transform == "none" else f"query_influence_{transform}"


def reduce_query_influence(pairwise: np.ndarray, sign: float = 1.0, reduce: str = "max") -> np.ndarray:
    """One suspicion score per training image (N,) from its influence on the queries (Q, N).

    Each query's row is standardised (z-scores over the training images, so that queries with
    large gradients do not dominate), multiplied by ``sign``, then reduced over the queries:

    * ``max``: the largest, i.e. how strongly the image pushes the one query it pushes most. A
      corrupted image typically matters to few queries (a flipped label ties two classes; a
      misclassified query involves one pair), so a mean dilutes it.
    * ``mean``: the mean (:func:`epochlens.study.detection.query_signal`): images that push most queries.

    Rows that are all NaN (queries skipped) are ignored; NaN where no query scores the image.
    """
    if reduce == "mean":
        return query_signal(pairwise, sign=sign)
    if reduce != "max":
        raise ConfigError(f"queries.reduce={reduce!r} must be one of {list(QUERY_REDUCTIONS)}")
    pairwise = np.asarray(pairwise, dtype=np.float64)
    rows = pairwise[np.isfinite(pairwise).any(1)] if pairwise.ndim == 2 else pairwise
    if pairwise.ndim != 2 or len(rows) == 0:
        return np.full(pairwise.shape[-1], np.nan)
    mu = np.nanmean(rows, axis=1, keepdims=True)
    sd = np.nanstd(rows, axis=1, keepdims=True)
    z = sign * (rows - mu) / np.where(sd > 0, sd, 1.0)
    finite = np.isfinite(z)
    best = np.where(finite, z, -np.inf).max(0)
    return np.where(finite.any(0), best, np.nan)


def study_signals(
    method: str,
    self_scores: np.ndarray,
    pairwise: Mapping[str, np.ndarray],
    sign: float,
    reduce: str = "max",
) -> dict[tuple[str, str], np.ndarray]:
    """Per-image suspicion signals (N,) of one method, keyed (method, signal).

    ``self_influence`` is the self-influence; ``query_influence[_<transform>]`` the influence on
    the queries reduced by :func:`reduce_query_influence` (one per query transform; all NaN
    without queries).
    """
    signals = {(method, "self_influence"): np.asarray(self_scores, np.float64)}
    for transform, scores in pairwise.items():
        signals[(method, query_signal_name(transform))] = reduce_query_influence(scores, sign, reduce)
    return signals


def roc_table(signals: Mapping[tuple[str, str], np.ndarray], corrupted: np.ndarray) -> pd.DataFrame:
    """ROC curve points of every signal: columns method, signal, fpr, tpr (NaN scores left out)."""
    frames = []
    for (method, signal), scores in signals.items():
        scores = np.asarray(scores, np.float64)
        mask = np.zeros(len(scores), bool)
        mask[np.asarray(corrupted, np.int64)] = True
        keep = np.isfinite(scores)
        if mask[keep].all() or not mask[keep].any():
            continue
        fpr, tpr, _ = roc_curve(mask[keep], scores[keep])
        frames.append(pd.DataFrame({"method": method, "signal": signal, "fpr": fpr, "tpr": tpr}))
    columns = ["method", "signal", "fpr", "tpr"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def top_ranked(
    signals: Mapping[tuple[str, str], np.ndarray], corrupted: np.ndarray, labels: np.ndarray, k: int
) -> pd.DataFrame:
    """The k highest-scored training images of every signal.

    Columns: method, signal, rank (1 = most suspicious), sample (training position), score, label
    (the label trained on), corrupted (bool). Ties are broken by position.
    """
    mask = np.zeros(len(labels), bool)
    mask[np.asarray(corrupted, np.int64)] = True
    rows = []
    for (method, signal), scores in signals.items():
        scores = np.asarray(scores, np.float64)
        finite = np.flatnonzero(np.isfinite(scores))
        order = finite[np.argsort(-scores[finite], kind="stable")][:k]
        for rank, n in enumerate(order, start=1):
            rows.append(
                {
                    "method": method,
                    "signal": signal,
                    "rank": rank,
                    "sample": int(n),
                    "score": float(scores[n]),
                    "label": int(labels[n]),
                    "corrupted": bool(mask[n]),
                }
            )
    return pd.DataFrame(rows, columns=["method", "signal", "rank", "sample", "score", "label", "corrupted"])


def influence_settings(settings: Mapping, execution: Mapping | None = None) -> InfluenceSettings:
    """:class:`InfluenceSettings` from a run's influence config.

    Args:
        settings: the keys that change results (method, and as present fisher, layers,
            exclude_layers, seed, damping, damping_mode, precondition_dtype); others are ignored.
        execution: batch sizes (factor_batch_size, train_batch_size, query_batch_size), which do
            not change results.
    """
    keys = ("method", "fisher", "seed", "damping", "damping_mode", "precondition_dtype")
    kwargs = {k: settings[k] for k in keys if k in settings}
    if kwargs.get("fisher") is True:  # YAML's unquoted true
        kwargs["fisher"] = "true"
    for k in ("layers", "exclude_layers"):
        if k in settings:
            kwargs[k] = tuple(settings[k])
    for k in ("factor_batch_size", "train_batch_size", "query_batch_size"):
        if execution and k in execution:
            kwargs[k] = int(execution[k])
    return InfluenceSettings(**kwargs)
