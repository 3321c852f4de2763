"""Per-sample outcomes that are not a classifier's: a causal language model's loss on its target
tokens and whether it is right, and a regression's squared error (:func:`squared_error`).

A causal LM's sample is a prompt followed by a target; its token labels (N, L) hold the target's
ids and -100 (:data:`IGNORE_INDEX`) at the prompt and the padding (Hugging Face's convention).
The logits at position t predict the token at t + 1 (the shift Hugging Face's loss makes). Per
sample:

* loss = the mean negative log-likelihood of its target tokens, in nats: what transformers' own
  ``model(..., labels=labels).loss`` is for that sample alone (the loss the evaluation, the
  ablations and the influence task :class:`epochlens.tasks.LanguageModelTask` share);
* correct = exact match: every target token is the model's top choice (teacher forcing: each
  position sees the true tokens before it).

A text-to-text (encoder-decoder) model's sample is an encoder input and decoder labels (N, T):
the model is given the labels with its inputs (:meth:`epochlens.data.text.TextDataset.inputs`),
builds its decoder inputs from them, and its logits at position t predict label t: no shift
(:func:`shifts`). Its loss and exact match are defined as above, transformers' own loss too.

Such a sample has no class: the tables give all of them the one class :data:`LM_CLASS_NAME`
(id 0, in task 0), so per-group tables and figures read them as they read a classifier's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the evaluation's tables import this module without torch
    import torch

IGNORE_INDEX = -100
LM_CLASS_NAME = "target tokens"


def shifts(inputs: object) -> bool:
    """Whether a sequence model's logits at t predict label t + 1 (a causal LM), or label t (a
    text-to-text model, whose keyword inputs carry the decoder ``labels``)."""
    return not (isinstance(inputs, Mapping) and "labels" in inputs)


def sequence_outcome(
    logits: torch.Tensor, labels: torch.Tensor, keep_dtype: bool = False, shift: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct (B,) bool, loss (B,)) of logits (B, L, V) on token labels (B, L): the loss in
    float64, or with ``keep_dtype`` in the logits' dtype (the curvature's compute dtype; the loss
    is differentiable either way). ``shift``: the logits at t predict label t + 1 (a causal LM);
    without, label t (a text-to-text model's decoder).

    A sample without a target token has loss NaN and is not correct."""
    import torch

    z = logits[:, :-1] if shift else logits
    z = z if keep_dtype else z.double()
    target = (labels[:, 1:] if shift else labels).to(z.device)
    valid = target != IGNORE_INDEX
    safe = torch.where(valid, target, torch.zeros_like(target))
    nll = -torch.log_softmax(z, dim=2).gather(2, safe[:, :, None])[:, :, 0]
    count = valid.sum(1)
    loss = torch.where(valid, nll, torch.zeros_like(nll)).sum(1) / count
    hit = (z.argmax(2) == safe) | ~valid
    return hit.all(1) & (count > 0), loss


REDUCTIONS = ("mean", "sum")


def regression_reduction(task: str | dict | None) -> str:
    """A run's ``task`` section's per-sample squared error: ``mean`` (default) or ``sum`` over a
    sample's values (``{name: regression, kwargs: {reduction: sum}}``)."""
    if not isinstance(task, dict):
        return "mean"
    return {**task, **task.get("kwargs", {})}.get("reduction", "mean")


def squared_error(prediction: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """A regression's per-sample loss (B,): ``mean`` ‖z − y‖²/D over a sample's D values (what
    ``nn.MSELoss`` gives for that sample alone), or ``sum`` ‖z − y‖². Prediction (B, ...) and
    targets (B, ...) must hold the same number of values per sample; the loss is differentiable
    in the prediction and keeps its dtype."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} must be one of {REDUCTIONS}")
    z = prediction.reshape(prediction.shape[0], -1)
    y = targets.to(device=z.device, dtype=z.dtype).reshape(z.shape[0], -1)
    if y.shape != z.shape:
        raise ValueError(
            f"targets of {y.shape[1]} values per sample for predictions of {z.shape[1]}: the model's "
            "outputs must match the targets (a regression head with one output per target value)."
        )
    sq = ((z - y) ** 2).sum(1)
    return sq / z.shape[1] if reduction == "mean" else sq


def sample_classes(labels: np.ndarray) -> np.ndarray:
    """Each sample's class id: the labels of a classifier's data (N,); 0 for a causal LM's token
    labels (N, L) and for a regression's float targets (N,) or (N, D), which have no classes."""
    if np.ndim(labels) == 1 and np.issubdtype(np.asarray(labels).dtype, np.integer):  # token labels unread
        return np.asarray(labels)
    return np.zeros(len(labels), dtype=np.int64)
