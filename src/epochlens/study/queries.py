"""The queries of the data-quality study: the test images whose predictions are attributed.

:func:`select_queries` picks them (by default those the checkpoint gets wrong), with the labels
they are scored under and, for a backdoor study, the trigger patch stamped on them;
:func:`select_regression_queries` picks a regression's (all test samples, or those with the
highest loss), scored under their own targets; :func:`select_lm_queries` a language model's (test
prompts with their target tokens, scored under those targets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from epochlens.batches import num_samples, select_rows, to_device
from epochlens.data import Dataset
from epochlens.data.text import IGNORE_INDEX, TextDataset
from epochlens.errors import ConfigError, DataError
from epochlens.models.networks import restrict_logits
from epochlens.outcome import shifts
from epochlens.study.corruption import apply_trigger, trigger_value
from epochlens.study.settings import QUERY_LABELS, QUERY_SELECTIONS
from epochlens.tasks import OutputAdapter, call_model
from epochlens.tasks.regression import predict_regression


@dataclasses.dataclass
class QuerySet:
    """Queries of the influence study.

    Attributes:
        test_indices: (Q,) int64 positions in the test split.
        images: (Q, C, H, W) float32 normalised images (trigger stamped where ``triggered``), or a
            text run's keyword inputs (``input_ids``, ``attention_mask``: (Q, L) each).
        labels: (Q,) int64 labels whose loss each query measures (predicted or correct); a
            regression's targets (Q,) or (Q, D), as stored.
            A language model's token labels (Q, L) (:func:`select_lm_queries`).
        true_labels, predicted: (Q,) int64 the test set's labels and the checkpoint's predictions
            (a regression's: its targets, and its predictions (Q, D) float64).
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
    images: torch.Tensor | Mapping[str, torch.Tensor],
    active_classes: np.ndarray,
    device: torch.device,
    batch_size: int = 512,
) -> np.ndarray:
    """Predicted class ids (N,) int64 among ``active_classes`` (restricted logits, eval mode)."""
    was_training = model.training
    model.eval().to(device)
    active = np.asarray(active_classes, np.int64)
    out = []
    n = num_samples(images)
    for start in range(0, n, batch_size):
        rows = torch.arange(start, min(start + batch_size, n))
        logits = restrict_logits(call_model(model, to_device(select_rows(images, rows), device)), active)
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
            test images of the other active classes (the target's own images do not qualify); for a
            text data set its test sentences with the trigger phrase (``trigger_input_ids``); None:
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
        data = _stamped(data, trigger)
    candidates = np.flatnonzero(eligible)
    images = (
        data.inputs("test", candidates)
        if isinstance(data, TextDataset)
        else data.normalized("test", candidates)
    )
    predicted = predict(model, images, active, device)
    true = data.test_labels[candidates]
    keep = predicted != true if select == "misclassified" else np.ones(len(candidates), bool)
    rows = np.flatnonzero(keep)
    n_qualified = len(rows)
    if len(rows) > max_count:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_count, replace=False))
    return QuerySet(
        test_indices=candidates[rows].astype(np.int64),
        images=select_rows(images, torch.as_tensor(rows, dtype=torch.long)),
        labels=(predicted if labels == "predicted" else true)[rows].astype(np.int64),
        true_labels=true[rows].astype(np.int64),
        predicted=predicted[rows].astype(np.int64),
        triggered=trigger is not None,
        sign=1.0 if labels == "predicted" else -1.0,
        candidates=n_qualified,
    )


def _stamped(data: Dataset | TextDataset, trigger: Mapping) -> Dataset | TextDataset:
    """The data set with the trigger on its test split: the patch stamped on the images, or a text
    data set's test sentences with the phrase (stored by prepare_data: ``trigger_input_ids``)."""
    if not isinstance(data, TextDataset):
        stamped = apply_trigger(
            data.test_images, int(trigger["patch_size"]), trigger["corner"], trigger_value(data)
        )
        return dataclasses.replace(data, test_images=stamped)
    if data.trigger_input_ids is None:
        raise DataError(
            "queries with a trigger: this text data set has no test sentences with the trigger phrase "
            "(data.corruption.kind: trigger with a phrase stores them); rerun prepare_data."
        )
    return dataclasses.replace(
        data,
        test_input_ids=data.trigger_input_ids,
        test_attention_mask=data.trigger_attention_mask,
        test_text=data.trigger_text,
    )


def select_regression_queries(
    model: nn.Module,
    data: Dataset,
    device: torch.device,
    select: str = "all",
    max_count: int = 50,
    seed: int = 0,
    reduction: str = "mean",
) -> QuerySet:
    """A regression's queries: the test samples under their own targets (training samples with
    negative influence raise a query's squared error: ``sign`` -1).

    Args:
        select: ``all`` (a seeded subset of ``max_count`` when there are more) or ``highest_loss``
            (the ``max_count`` test samples with the largest loss, ties by position).
        reduction: the squared error's mean or sum over a sample's values (the run's task).
    """
    if select not in ("all", "highest_loss"):
        raise ConfigError(
            f"queries.select={select!r}: a regression's queries are all test samples or those with the "
            "highest loss (select: all or highest_loss); it has no misclassified ones."
        )
    images = data.normalized("test")
    targets = data.test_labels
    predicted, loss = predict_regression(model, images, targets, reduction, device=device)
    rows = np.arange(len(targets))
    if len(rows) > max_count:
        if select == "highest_loss":
            rows = np.sort(np.argsort(-loss, kind="stable")[:max_count])
        else:
            rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_count, replace=False))
    return QuerySet(
        test_indices=rows.astype(np.int64),
        images=images[torch.as_tensor(rows, dtype=torch.long)],
        labels=targets[rows],
        true_labels=targets[rows],
        predicted=predicted[rows].reshape((len(rows), *targets.shape[1:])),
        triggered=False,
        sign=-1.0,
        candidates=len(targets),
    )


@torch.no_grad()
def predict_tokens(
    model: nn.Module,
    inputs: Mapping[str, torch.Tensor],
    labels: np.ndarray,
    device: torch.device,
    batch_size: int = 64,
) -> np.ndarray:
    """A causal language model's top token at each target position, (N, L) int64 aligned with the
    token ``labels`` (N, L) (the logits at t - 1 predict token t), -100 where there is no target.
    A text-to-text model (its ``inputs`` hold the decoder labels): the logits at t predict label t."""
    was_training = model.training
    model.eval().to(device)
    out = np.full(labels.shape, IGNORE_INDEX, dtype=np.int64)
    for start in range(0, len(labels), batch_size):
        rows = torch.arange(start, min(start + batch_size, len(labels)))
        batch = select_rows(inputs, rows)
        logits = OutputAdapter()(call_model(model, to_device(batch, device)))
        shift = int(shifts(batch))
        top = logits[:, : logits.shape[1] - shift].argmax(2).cpu().numpy()
        block = labels[start : start + len(rows), shift:]
        out[start : start + len(rows), shift:] = np.where(block != IGNORE_INDEX, top, IGNORE_INDEX)
    model.train(was_training)
    return out


def select_lm_queries(
    model: nn.Module,
    data: TextDataset,
    device: torch.device,
    select: str = "all",
    max_count: int = 50,
    seed: int = 0,
) -> QuerySet:
    """A language model's queries: test prompts with their target tokens, scored under those
    targets (the per-sample loss, the targets' mean NLL; training samples with negative influence
    raise a query's loss: ``sign`` -1). ``labels`` and ``true_labels`` are the token labels (Q, L),
    ``predicted`` the model's top token at each target position (Q, L), -100 elsewhere.

    Args:
        select: ``all`` (a seeded subset of ``max_count`` when there are more): a language model
            has no misclassified queries.
    """
    if select != "all":
        raise ConfigError(
            f"queries.select={select!r}: a language model's queries are its test prompts (select: all); "
            "it has no class predictions to be wrong."
        )
    rows = np.arange(len(data.test_labels))
    if len(rows) > max_count:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_count, replace=False))
    inputs = data.inputs("test", rows)
    labels = data.test_labels[rows]
    return QuerySet(
        test_indices=rows.astype(np.int64),
        images=inputs,
        labels=labels,
        true_labels=labels,
        predicted=predict_tokens(model, inputs, labels, device),
        triggered=False,
        sign=-1.0,
        candidates=len(data.test_labels),
    )
