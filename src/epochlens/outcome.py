"""A causal language model's per-sample outcome on its targets: its loss and whether it is right.

A causal LM's sample is a prompt followed by a target; its token labels (N, L) hold the target's
ids and -100 (:data:`IGNORE_INDEX`) at the prompt and the padding (Hugging Face's convention).
The logits at position t predict the token at t + 1 (the shift Hugging Face's loss makes). Per
sample:

* loss = the mean negative log-likelihood of its target tokens, in nats: what transformers' own
  ``model(..., labels=labels).loss`` is for that sample alone (the loss the evaluation, the
  ablations and the influence task :class:`epochlens.tasks.LanguageModelTask` share);
* correct = exact match: every target token is the model's top choice (teacher forcing: each
  position sees the true tokens before it).

Such a sample has no class: the tables give all of them the one class :data:`LM_CLASS_NAME`
(id 0, in task 0), so per-group tables and figures read them as they read a classifier's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the evaluation's tables import this module without torch
    import torch

IGNORE_INDEX = -100
LM_CLASS_NAME = "target tokens"


def sequence_outcome(
    logits: torch.Tensor, labels: torch.Tensor, keep_dtype: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct (B,) bool, loss (B,)) of logits (B, L, V) on token labels (B, L): the loss in
    float64, or with ``keep_dtype`` in the logits' dtype (the curvature's compute dtype; the loss
    is differentiable either way).

    A sample without a target token has loss NaN and is not correct."""
    import torch

    z = logits[:, :-1] if keep_dtype else logits[:, :-1].double()
    target = labels[:, 1:].to(z.device)
    valid = target != IGNORE_INDEX
    safe = torch.where(valid, target, torch.zeros_like(target))
    nll = -torch.log_softmax(z, dim=2).gather(2, safe[:, :, None])[:, :, 0]
    count = valid.sum(1)
    loss = torch.where(valid, nll, torch.zeros_like(nll)).sum(1) / count
    hit = (z.argmax(2) == safe) | ~valid
    return hit.all(1) & (count > 0), loss


def sample_classes(labels: np.ndarray) -> np.ndarray:
    """Each sample's class id: the labels of a classifier's data (N,), 0 for a causal LM's token
    labels (N, L)."""
    labels = np.asarray(labels)
    return labels if labels.ndim == 1 else np.zeros(len(labels), dtype=np.int64)
