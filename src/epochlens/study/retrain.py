"""Retraining on subsets of the training samples (images, a text classifier's sentences, or a
text-to-text model's prompts and targets), for the linear datamodeling score
(:mod:`epochlens.study.lds`): what the workflow's ``lds_retrain`` jobs do.

Each subset is trained from scratch with the run's own recipe (:func:`epochlens.training.
train_incremental`: the same initial weights, seed, schedule, learning rates, early stopping on
the holdout), with the training samples outside the subset removed, up to the analysed epoch, or
(``influence.lds.start: previous``) warm-started from the run's checkpoint before the analysed one
and trained for the epochs in between only (the affordable choice for a large run: what the
scores are asked to predict is then the last stretch of training); the model of the analysed
epoch then gives the log-probabilities of every test image over the classes active at that
epoch, from which the tables job reads each query's loss, or, for a text-to-text model (token
labels, no classes), every test sample's loss under its own target: the mean NLL of its target
tokens, the per-sample loss of the evaluation and of the influence task
(:func:`test_sequence_losses`). With every sample kept, a retraining is the run's own training,
checkpoint for checkpoint (tests).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from epochlens.atomic import orphan_tag, remove_orphans
from epochlens.batches import num_samples, select_rows, to_device
from epochlens.data import Dataset
from epochlens.data.text import TextDataset
from epochlens.layout import epoch_name
from epochlens.models.networks import restrict_logits
from epochlens.outcome import sequence_outcome, shifts
from epochlens.schedule import ClassSchedule
from epochlens.tasks import call_model
from epochlens.training import TrainSettings, train_incremental

log = logging.getLogger("epochlens")


#: A text data set's fields with one row per training sample (:func:`subset_data` keeps rows).
_TRAIN_ROWS = ("train_input_ids", "train_attention_mask", "train_labels", "holdout", "train_groups",
               "train_text", "ground_truth")  # fmt: skip


def subset_data(data: Dataset | TextDataset, keep: np.ndarray) -> Dataset | TextDataset:
    """``data`` with the training samples outside ``keep`` (N,) bool taken out of training: their
    label becomes -1, a class no task has (the holdout is kept: it drives early stopping). Token
    labels (a sequence model's targets) have no class to mark: those samples' rows are removed
    from the training split instead, which trains on the same samples in the same batches (the
    order is drawn over the samples trained on)."""
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != data.train_labels.shape[:1]:
        raise ValueError(f"subset mask of shape {keep.shape} for {len(data.train_labels)} training samples")
    if isinstance(data, TextDataset) and data.token_labels:
        rows = keep | data.holdout
        kept = {}
        for name in _TRAIN_ROWS:
            value = getattr(data, name)
            if value is not None:
                kept[name] = (
                    [value[i] for i in np.flatnonzero(rows)] if isinstance(value, list) else value[rows]
                )
        return dataclasses.replace(data, **kept)
    labels = np.where(keep | data.holdout, data.train_labels, -1)
    return dataclasses.replace(data, train_labels=labels)


def subset_masks(eligible: np.ndarray, subsets: int, fraction: float, seed: int) -> np.ndarray:
    """(M, N) bool: subset m keeps round(fraction · n) of the n ``eligible`` training images,
    drawn without replacement from a generator seeded by (seed, m) alone, so that a subset is the
    same whichever job (part) retrains it. Images not eligible (the holdout) are in no subset."""
    eligible = np.asarray(eligible, dtype=bool)
    pool = np.flatnonzero(eligible)
    k = int(round(fraction * len(pool)))
    masks = np.zeros((subsets, len(eligible)), dtype=bool)
    for m in range(subsets):
        rng = np.random.default_rng([seed, m])
        masks[m, rng.choice(pool, size=k, replace=False)] = True
    return masks


def part_subsets(subsets: int, part: int, parts: int) -> np.ndarray:
    """The subset ids retrained by job ``part`` of ``parts`` (contiguous, as even as possible)."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} is not one of 0..{parts - 1}")
    return np.array_split(np.arange(subsets), parts)[part]


@torch.no_grad()
def test_log_probs(
    model: nn.Module,
    data: Dataset | TextDataset,
    active: np.ndarray,
    device: torch.device,
    batch_size: int = 1024,
) -> np.ndarray:
    """(N_test, A) float32 log-probabilities of every test sample over the ``active`` classes
    (images normalised as the run trains on them; a text classifier's token ids and masks)."""
    model.eval().to(device)
    x = data.inputs("test") if isinstance(data, TextDataset) else data.normalized("test")
    n = num_samples(x)
    parts = []
    for s in range(0, n, batch_size):
        batch = to_device(select_rows(x, torch.arange(s, min(s + batch_size, n))), device)
        logits = restrict_logits(call_model(model, batch), active)
        parts.append(torch.log_softmax(logits.double(), 1))
    return torch.cat(parts).float().cpu().numpy()


@torch.no_grad()
def test_sequence_losses(
    model: nn.Module, data: TextDataset, device: torch.device, batch_size: int = 256
) -> np.ndarray:
    """(N_test,) float64 loss of every test sample under its own target: the mean negative
    log-likelihood of its target tokens (:func:`epochlens.outcome.sequence_outcome`; a text-to-text
    model is given its decoder labels with its inputs, a causal LM's logits are shifted), what
    transformers' ``model(..., labels=labels).loss`` is for that sample alone."""
    model.eval().to(device)
    x, labels = data.inputs("test"), torch.as_tensor(data.test_labels)
    parts = []
    for s in range(0, len(labels), batch_size):
        rows = torch.arange(s, min(s + batch_size, len(labels)))
        batch = to_device(select_rows(x, rows), device)
        parts.append(sequence_outcome(call_model(model, batch), labels[rows], shift=shifts(batch))[1].cpu())
    return torch.cat(parts).numpy() if parts else np.zeros(0)


def test_measure(
    data: Dataset | TextDataset, active: np.ndarray, device: torch.device
) -> Callable[[nn.Module], np.ndarray]:
    """What a retrained model is measured by: a classifier's test log-probabilities (N_test, A)
    over the ``active`` classes (:func:`test_log_probs`), or, for token labels, each test sample's
    loss under its own target (N_test,) (:func:`test_sequence_losses`)."""
    if isinstance(data, TextDataset) and data.token_labels:
        return lambda model: test_sequence_losses(model, data, device)
    return lambda model: test_log_probs(model, data, active, device)


def retrain_subsets(
    build_model: Callable[[], nn.Module],
    data: Dataset | TextDataset,
    schedule: ClassSchedule,
    settings: TrainSettings,
    epoch: int,
    masks: np.ndarray,
    save_every: int | None = None,
    device: torch.device | str = "cpu",
    scratch: str | Path | None = None,
    start: tuple[int, Mapping[str, torch.Tensor]] | None = None,
) -> np.ndarray:
    """Retrain on each subset ``masks`` (m, N) and return what the model at ``epoch`` gives
    (:func:`test_measure`): the test log-probabilities (m, N_test, A) over the classes active
    then, or for token labels each test sample's loss (m, N_test).

    Args:
        build_model: a fresh model with the run's initial weights (the same seed as the run).
        data, schedule, settings, save_every: the run's, as its training job uses them; ``epoch``
            must be one of its checkpoint epochs.
        device: where to train.
        scratch: folder for the retrainings' checkpoints (a temporary folder inside it, deleted
            after each subset); default: the system's.
        start: (E0, the run's weights at its checkpoint E0 < ``epoch``): warm-start every
            retraining there and train epochs E0 + 1 .. ``epoch`` only; None: from scratch.
    """
    device = torch.device(device)
    if epoch not in schedule.checkpoint_epochs(save_every):
        raise ValueError(f"epoch {epoch} is not a checkpoint epoch of the run")
    if start is not None and not 0 <= start[0] < epoch:
        raise ValueError(f"a warm start at epoch {start[0]} must come before the analysed epoch {epoch}")
    active = schedule.active_classes(epoch)
    measure = test_measure(data, active, device)
    if scratch is not None:  # those of a retraining killed before it could delete them
        remove_orphans(Path(scratch), "lds-")
    out = []
    for k, keep in enumerate(np.asarray(masks, dtype=bool)):
        began = time.perf_counter()
        model = build_model()
        with tempfile.TemporaryDirectory(dir=scratch, prefix=f"lds-{orphan_tag()}") as tmp:
            train_incremental(
                model, subset_data(data, keep), schedule, settings,
                checkpoint_path=lambda e, folder=Path(tmp): folder / f"{epoch_name(e)}.pt",
                save_every=save_every, device=device, progress=False, start=start, stop_epoch=epoch,
            )  # fmt: skip
            state = torch.load(Path(tmp) / f"{epoch_name(epoch)}.pt", map_location=device, weights_only=True)
        model.load_state_dict(state)
        out.append(measure(model))
        log.info(
            "subset %d of %d: %d training samples, retrained in %.1f s",
            k + 1, len(masks), int(keep.sum()), time.perf_counter() - began,
        )  # fmt: skip
    if out:
        return np.stack(out)
    if isinstance(data, TextDataset) and data.token_labels:
        return np.zeros((0, len(data.test_labels)))
    return np.zeros((0, len(data.test_labels), len(active)), np.float32)


def retrain_part(
    build_model: Callable[[], nn.Module],
    data: Dataset | TextDataset,
    schedule: ClassSchedule,
    settings: TrainSettings,
    epoch: int,
    lds: dict,
    part: int,
    parts: int,
    save_every: int | None = None,
    device: torch.device | str = "cpu",
    scratch: str | Path | None = None,
    start: tuple[int, Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, np.ndarray]:
    """Part ``part`` of ``parts`` of the retrainings of ``influence.lds`` (``lds``: subsets,
    fraction, seed; ``start`` as :func:`retrain_subsets`): the contents of its
    ``retrain_{k}-of-{P}.npz``: ``subset_ids`` (m,), ``masks`` (m, N) bool, and
    ``log_probs`` (m, N_test, A) float32 with ``active_classes`` (A,), or for token labels (a
    text-to-text model's) ``test_losses`` (m, N_test) float64, as a regression's parts hold them."""
    eligible = ~data.holdout
    masks = subset_masks(eligible, lds["subsets"], lds["fraction"], lds["seed"])
    ids = part_subsets(lds["subsets"], part, parts)
    log.info(
        "LDS retrainings %s of %d at epoch %d (part %d of %d), %.0f%% of %d training samples each, %s",
        ids.tolist(), lds["subsets"], epoch, part + 1, parts, 100 * lds["fraction"], int(eligible.sum()),
        "from scratch" if start is None else f"from the run's epoch {start[0]}",
    )  # fmt: skip
    measured = retrain_subsets(
        build_model, data, schedule, settings, epoch, masks[ids], save_every, device, scratch, start
    )
    arrays = {"subset_ids": ids.astype(np.int64), "masks": masks[ids]}
    if isinstance(data, TextDataset) and data.token_labels:
        return {**arrays, "test_losses": measured.astype(np.float64)}
    return {
        **arrays,
        "log_probs": measured,
        "active_classes": schedule.active_classes(epoch).astype(np.int64),
    }
