"""What one checkpoint predicts for every sample: the dossier's series that no other stage caches.

For a classifier (images or text) over the classes active at the checkpoint (logits restricted
to them, as every stage does), per sample x with label y and logits z:

    loss(x)    = cross-entropy of the restricted logits       (nats)
    p_label(x) = softmax(z)_y                                  probability of the label
    margin(x)  = z_y − max_{c≠y} z_c                           AUM's margin (Pleiss et al. 2020)
    correct(x) = argmax z == y

Samples whose class is not active are NaN (``correct`` False). With a single active class the
margin is NaN (there is no other class). A regression gives ``loss`` (the run's squared error) and
``abs_error`` (mean |prediction − target| over the sample's values); a causal LM's or a
text-to-text model's ``loss`` (mean NLL of the target tokens) and ``correct`` (exact match), as
the evaluation stage measures them (:func:`epochlens.outcome.sequence_outcome`). Every array is
(N,) in the order of the split; an index's file (``index-{i}/sample_outputs.npz``) stacks its
checkpoints, (m, N).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn

    from epochlens.job import CheckpointJob

#: Series of a classifier, a regression and a sequence model (the keys of :func:`split_outputs`).
CLASSIFIER_KEYS = ("loss", "p_label", "margin", "correct", "predicted")
REGRESSION_KEYS = ("loss", "abs_error")
SEQUENCE_KEYS = ("loss", "correct")
SPLITS = ("train", "test")


def classifier_outcome(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """loss, p_label, margin, correct and predicted (a position in the logits) of logits (B, C)
    for targets (B,) (positions in the logits), float64."""
    import torch

    z = logits.double()
    logp = torch.log_softmax(z, dim=1)
    picked = z.gather(1, targets[:, None])[:, 0]
    others = z.scatter(1, targets[:, None], float("-inf"))
    margin = picked - others.max(1).values if z.shape[1] > 1 else torch.full_like(picked, float("nan"))
    predicted = z.argmax(1)
    return {
        "loss": -logp.gather(1, targets[:, None])[:, 0],
        "p_label": logp.gather(1, targets[:, None])[:, 0].exp(),
        "margin": margin,
        "correct": predicted == targets,
        "predicted": predicted,
    }


def _batches(inputs, n: int, batch_size: int, device):
    """``(rows, batch)`` of ``n`` rows of the inputs (a tensor or a mapping of them)."""
    from epochlens.batches import to_device

    for start in range(0, n, batch_size):
        rows = slice(start, start + batch_size)
        if isinstance(inputs, Mapping):
            yield rows, to_device({k: v[rows] for k, v in inputs.items()}, device)
        else:
            yield rows, inputs[rows].to(device)


def classifier_outputs(
    model: nn.Module, inputs, labels: np.ndarray, active: np.ndarray, batch_size: int, device
) -> dict[str, np.ndarray]:
    """:func:`classifier_outcome` of every sample (N,) whose label is active; NaN (False, -1)
    for the others. ``predicted`` is a class id."""
    import torch

    from epochlens.models.networks import positions_in, restrict_logits
    from epochlens.tasks import call_model

    n = len(labels)
    out = {key: np.full(n, np.nan) for key in ("loss", "p_label", "margin")}
    out["correct"], out["predicted"] = np.zeros(n, bool), np.full(n, -1, np.int64)
    idx = np.flatnonzero(np.isin(labels, active))
    if len(idx) == 0:
        return out

    def pick(x):  # rows read a batch at a time (images, a text run's tokens) picked without reading
        return x.select(idx) if hasattr(x, "select") else x[idx]

    if len(idx) < n:  # else every sample, in order: the inputs as they are
        inputs = {k: pick(v) for k, v in inputs.items()} if isinstance(inputs, Mapping) else pick(inputs)
    model.eval().to(device)
    with torch.no_grad():  # each batch's outcome into the results: no list of batches to join
        for rows, xb in _batches(inputs, len(idx), batch_size, device):
            logits = restrict_logits(call_model(model, xb), active)
            targets = torch.as_tensor(positions_in(labels[idx[rows]], active), device=device)
            for key, values in classifier_outcome(logits, targets).items():
                out[key][idx[rows]] = values.cpu().numpy()
    out["predicted"][idx] = np.asarray(active)[out["predicted"][idx]]
    return out


def sequence_outputs(model: nn.Module, inputs, labels: np.ndarray, batch_size: int, device) -> dict:
    """A causal LM's or text-to-text model's loss (mean NLL of the target tokens) and exact match
    of every sample, :func:`epochlens.outcome.sequence_outcome` of its token labels (N, L)."""
    import torch

    from epochlens.outcome import sequence_outcome, shifts
    from epochlens.tasks import call_model

    model.eval().to(device)
    out = {"loss": np.zeros(len(labels)), "correct": np.zeros(len(labels), bool)}
    with torch.no_grad():  # each batch's outcome into the arrays: no list of batches to join
        for rows, xb in _batches(inputs, len(labels), batch_size, device):
            targets = torch.as_tensor(np.asarray(labels[rows]), device=device)  # the batch's rows read
            hit, loss = sequence_outcome(call_model(model, xb), targets, shift=shifts(xb))
            out["loss"][rows], out["correct"][rows] = loss.double().cpu().numpy(), hit.cpu().numpy()
    return out


def split_outputs(
    job: CheckpointJob, split: str, batch_size: int, reduction: str = "mean", rows: tuple | None = None
) -> dict[str, np.ndarray]:
    """The series of the samples of ``split`` at positions ``rows`` = [lo, hi) (all of them by
    default; train: every training sample, the holdout too) at the job's checkpoint, read a batch
    at a time: :data:`CLASSIFIER_KEYS`, :data:`REGRESSION_KEYS` or :data:`SEQUENCE_KEYS` by the
    run's data."""
    from epochlens.data.rows import NormalizedRows
    from epochlens.data.text import TextDataset, TokenRows

    data = job.data
    lo, hi = rows or (0, len(data.labels(split)))
    text, positions = isinstance(data, TextDataset), np.arange(lo, hi)
    inputs = data.rows(split, positions) if text else NormalizedRows(data, split, positions)  # by batch
    if text and data.token_labels:  # its token labels read a batch at a time too
        labels = TokenRows(data.labels(split), positions)
        return sequence_outputs(job.model, inputs, labels, batch_size, job.device)
    labels = np.asarray(data.labels(split)[lo:hi])
    if getattr(data, "is_regression", False):
        from epochlens.tasks.regression import predict_regression

        pred, loss = predict_regression(job.model, inputs, labels, reduction, batch_size, job.device)
        error = np.abs(pred - np.asarray(labels, np.float64).reshape(len(labels), -1)).mean(1)
        return {"loss": loss, "abs_error": error}
    assert job.active is not None, "a classifier's outputs need its class schedule"
    return classifier_outputs(job.model, inputs, labels, job.active, batch_size, job.device)


def checkpoint_outputs(
    job: CheckpointJob,
    batch_size: int,
    reduction: str = "mean",
    trigger: Mapping | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, np.ndarray]:
    """Both splits' series at the job's checkpoint, keyed ``{split}_{series}`` (``train_loss``,
    ``test_p_label``, ...), ``epoch`` and each split's ``[lo, hi, n]`` as ``{split}_rows``: the
    samples of ``shard`` = (k, S), shard k of S of each split (:func:`epochlens.shards.shard_range`).
    ``trigger``: a backdoor's ``data.corruption`` (kind trigger), whose queries are the test samples
    with the trigger: their series too, as ``test_trigger_{series}``."""
    from epochlens.shards import shard_range

    arrays: dict[str, np.ndarray] = {"epoch": np.int64(job.epoch)}
    for split in SPLITS:
        n = len(job.data.labels(split))
        rows = shard_range(n, *shard)
        arrays[f"{split}_rows"] = np.array([*rows, n], np.int64)
        for key, values in split_outputs(job, split, batch_size, reduction, rows).items():
            arrays[f"{split}_{key}"] = values
        if split == "test" and trigger is not None and trigger.get("kind") == "trigger":
            stamped = triggered(job, trigger)
            for key, values in split_outputs(stamped, "test", batch_size, reduction, rows).items():
                arrays[f"test_trigger_{key}"] = values
    return arrays


def triggered(job: CheckpointJob, trigger: Mapping) -> CheckpointJob:
    """The job with the backdoor's trigger on its test split, as the influence queries have it
    (:func:`epochlens.study.queries.select_queries`)."""
    import dataclasses

    from epochlens.study.queries import _stamped  # the queries' own stamping, not a copy

    stamped = dataclasses.replace(job, data=_stamped(job.data, trigger))
    stamped.__dict__["model"] = job.model  # the same model (a cached property), not loaded again
    return stamped
