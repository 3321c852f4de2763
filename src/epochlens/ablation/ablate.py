"""Ablations of unit groups and their effect on old versus new classes.

A *unit group* is a set of channels of one block's output (dimension 1 of the module's output
(B, C, H, W), or of (B, D) for a linear layer):

* the whole block (all its channels, group name ``all``), and
* ``channel_groups`` contiguous groups of (nearly) equal size, named ``ch{start}-{stop-1}``
  (``numpy.array_split`` sizes; with ``channel_groups >= C`` every channel is its own group).

Blocks are given as module names, by default every block output (``features.default_layers``:
SmallCNN block1-3, ResNet18LoP layer1.0 ... layer4.1). A forward hook replaces the group's
channels in the block's output before the rest of the network sees them:

* ``zero``: by 0;
* ``mean``: by their mean over the reference images, per channel and spatial position (the mean
  activation map, accumulated in float64), so a unit that is constant over the data is unchanged.

Accuracy and cross-entropy use the logits of the active classes only (``models.restrict_logits``)
with targets at the label's position among them. Samples of inactive classes are left out. The
*old* cohort holds the active classes outside ``new_classes`` (earlier tasks), the *new* cohort
``new_classes`` (the current task), and ``all`` both.

Tidy output (:func:`ablation_table`), one row per (block, group, mode, cohort), with any context
columns (e.g. epoch, split) first: block, group, channel_start, channel_stop, n_channels, mode,
cohort, n_samples, accuracy_base, accuracy, delta_accuracy, loss_base, loss, delta_loss. Deltas are
ablated minus intact; losses in nats (mean over the cohort's samples).

A regression (float targets, :func:`epochlens.outcome.squared_error` as the loss, mean or sum over
a sample's values): every sample in the one cohort ``all``, no accuracy columns; ``loss`` is the
mean per-sample squared error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from epochlens.ablation.settings import MODES, AblationSettings
from epochlens.data import Dataset
from epochlens.device import autocast, model_device
from epochlens.errors import ConfigError, LayerError
from epochlens.in_place import evaluated
from epochlens.models.layers import channels_first, check_finite_weights, resolve_layers
from epochlens.models.networks import positions_in, restrict_logits
from epochlens.outcome import sequence_outcome, shifts, squared_error
from epochlens.progress import progress_bar

COHORTS = ("old", "new", "all")


@dataclass(frozen=True)
class UnitGroup:
    """Channels ``channel_start`` .. ``channel_stop - 1`` of the output of module ``block``."""

    block: str
    group: str
    channel_start: int
    channel_stop: int

    @property
    def n_channels(self) -> int:
        return self.channel_stop - self.channel_start


def channel_ranges(n_channels: int, n_groups: int) -> list[tuple[int, int]]:
    """(start, stop) of ``min(n_groups, n_channels)`` contiguous groups (``array_split`` sizes)."""
    k = min(n_groups, n_channels)
    if k <= 0:
        return []
    bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(n_channels), k)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def block_shapes(model: nn.Module, blocks: Sequence[str], sample: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """Per-sample output shape of each block, from one forward pass of ``sample`` (1, C, H, W).

    The pass runs in eval mode; the model's train/eval flags are restored afterwards.

    Raises:
        LayerError: a block whose output is not a (batch, channels, ...) tensor, or that runs other
            than once per forward pass.
    """
    modules = dict(model.named_modules())
    shapes: dict[str, tuple[int, ...]] = {}
    calls: dict[str, int] = {}

    def make(name: str):
        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            calls[name] = calls.get(name, 0) + 1
            if not isinstance(output, torch.Tensor) or output.ndim < 2:
                raise LayerError(
                    f"block {name!r} ({type(module).__name__}) does not return a (batch, channels, ...) "
                    "tensor; ablate another module (e.g. its parent block)."
                )
            shapes[name] = tuple(channels_first(output).shape[1:])

        return hook

    handles = [modules[b].register_forward_hook(make(b)) for b in blocks]
    training = {m: m.training for m in model.modules()}
    try:
        with torch.no_grad():
            model.eval()(sample)
    finally:
        for h in handles:
            h.remove()
        for m, flag in training.items():
            m.training = flag
    for b in blocks:
        if calls.get(b, 0) != 1:
            raise LayerError(
                f"block {b!r} ran {calls.get(b, 0)} times in one forward pass; ablating it would be "
                "ambiguous. Ablate a module that runs exactly once (such as the enclosing block)."
            )
    return shapes


def unit_groups(
    model: nn.Module, sample: torch.Tensor, settings: AblationSettings | None = None
) -> list[UnitGroup]:
    """This job's part (``settings.share``) of the unit groups: per block, whole, then by channels.

    ``sample`` is one normalised input (1, C, H, W) that fixes the blocks' channel counts.
    Raises LayerError for unknown block names (listing the available ones).
    """
    settings = settings or AblationSettings()
    blocks = resolve_layers(model, settings.blocks, key="ablation.blocks")
    shapes = block_shapes(model, blocks, sample)
    groups = []
    for b in blocks:
        c = shapes[b][0]
        if settings.whole_blocks:
            groups.append(UnitGroup(b, "all", 0, c))
        for start, stop in channel_ranges(c, settings.channel_groups):
            groups.append(UnitGroup(b, f"ch{start}-{stop - 1}", start, stop))
    return settings.share(groups)


@torch.no_grad()
def unit_means(
    net: nn.Module,
    images: torch.Tensor,
    blocks: Sequence[str],
    batch_size: int = 256,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Mean output of each block over ``images`` (N, C, H, W): per block a (C', H', W') float32 tensor.

    Accumulated in float64 (a unit constant over the images gets exactly its value back; float32 on
    MPS, which lacks float64).
    """
    device = model_device(net, device)
    modules = dict(net.named_modules())
    sums: dict[str, torch.Tensor] = {}

    def make(name: str):
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            acc = torch.float32 if output.device.type == "mps" else torch.float64  # MPS lacks float64
            s = channels_first(output).detach().to(acc).sum(0)
            sums[name] = s if name not in sums else sums[name] + s

        return hook

    handles = [modules[b].register_forward_hook(make(b)) for b in blocks]
    try:
        for lo in range(0, len(images), batch_size):
            net(images[lo : lo + batch_size].to(device, torch.float32))
    finally:
        for h in handles:
            h.remove()
    return {b: (sums[b] / len(images)).float() for b in blocks}


@contextmanager
def ablated(
    net: nn.Module, group: UnitGroup, mode: str, means: Mapping[str, torch.Tensor] | None = None
) -> Iterator[None]:
    """Inside the block, ``net``'s forward replaces ``group``'s channels (zero or mean)."""
    if mode not in MODES:
        raise ConfigError(f"ablation mode {mode!r} must be one of {list(MODES)}")
    if mode == "mean" and (means is None or group.block not in means):
        raise ValueError(f"mean ablation of {group.block!r} needs its unit means (see unit_means)")
    sl = slice(group.channel_start, group.channel_stop)
    module = dict(net.named_modules())[group.block]

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        view = channels_first(out)  # the channels of a (batch, tokens, features) output: features
        if mode == "zero":
            view[:, sl] = 0
        else:
            view[:, sl] = means[group.block][sl].to(out.device, out.dtype)
        return out

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def per_sample_outcome(
    net: nn.Module,
    images: torch.Tensor | Mapping[str, torch.Tensor],
    targets: np.ndarray,
    active_classes: np.ndarray,
    batch_size: int,
    device: torch.device,
    reduction: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(correct (N,) bool, loss (N,) float64 nats) over the restricted logits; eval mode expected.
    ``images``: (N, ...) inputs, or a text model's keyword inputs (each (N, L)); ``targets`` (N, L):
    a causal LM's token labels, (N, T) a text-to-text model's decoder labels
    (:func:`epochlens.outcome.sequence_outcome`); with ``reduction``
    (a regression): float targets, the loss their squared error and no sample correct."""
    correct, losses = [], []
    active = torch.as_tensor(np.asarray(active_classes, dtype=np.int64), device=device)
    t = torch.as_tensor(targets) if reduction else torch.as_tensor(targets, dtype=torch.long)
    for lo in range(0, len(t), batch_size):
        y = t[lo : lo + batch_size].to(device)
        if isinstance(images, Mapping):
            logits = net(**{k: v[lo : lo + batch_size].to(device) for k, v in images.items()})
        else:
            logits = net(images[lo : lo + batch_size].to(device, torch.float32))
        if reduction:
            losses.append(squared_error(logits.double(), y, reduction).cpu())
            correct.append(torch.zeros(len(y), dtype=torch.bool))
            continue
        if y.ndim == 2:  # token labels: a text-to-text model's inputs carry them (no shift)
            hit, loss = sequence_outcome(logits, y, shift=shifts(images))
            losses.append(loss.cpu())
            correct.append(hit.cpu())
            continue
        logits = restrict_logits(logits, active)
        losses.append(F.cross_entropy(logits, y, reduction="none").double().cpu())
        correct.append((logits.argmax(1) == y).cpu())
    return torch.cat(correct).numpy(), torch.cat(losses).numpy()


def ablation_table(
    model: nn.Module,
    images: torch.Tensor | np.ndarray,
    labels: np.ndarray,
    active_classes: np.ndarray,
    new_classes: np.ndarray,
    settings: AblationSettings | None = None,
    reference_images: torch.Tensor | np.ndarray | None = None,
    context: Mapping[str, object] | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
    reduction: str | None = None,
) -> pd.DataFrame:
    """Change in accuracy and loss on old, new and all active classes when each unit group is ablated.

    Args:
        model: classifier (B, C, H, W) -> (B, num_classes); not modified (a copy runs in eval mode).
        images: (N, C, H, W) normalised evaluation images (e.g. the test split or the holdout).
        labels: (N,) class ids, or with ``reduction`` a regression's float targets (N,) / (N, D).
        active_classes: classes trained at this checkpoint (restricted logits, in this order).
        new_classes: the current task's classes (a subset of ``active_classes``).
        settings: blocks, channel groups, modes, batch size.
        reference_images: images whose mean activations the mean ablation uses (e.g. the
            training images of the active classes); default: ``images``.
        context: constant columns put first in every row (e.g. ``{"epoch": 200, "split": "test"}``).
        device: "auto", "cpu", "cuda", ... ; None: the model's device.
        progress: progress bar over ablations.
        reduction: a regression's squared error, ``mean`` or ``sum`` over a sample's values (the
            run's task): every sample in cohort ``all``, loss columns only (module doc).

    Returns:
        Tidy DataFrame (columns in the module doc); cohorts without samples are left out.

    Raises:
        ConfigError: new classes outside the active ones, or no sample of an active class.
        LayerError: unknown blocks (listing the available ones).
    """
    settings = settings or AblationSettings()
    images = torch.as_tensor(images)
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if reduction:  # a regression: every sample, its targets as they are
        x, targets, active = images, np.asarray(labels), np.zeros(1, np.int64)
        cohorts = {"all": np.ones(len(targets), dtype=bool)}
    else:
        x, targets, active, cohorts = _classified(images, labels, active_classes, new_classes)

    dev = model_device(model, device)
    with evaluated(model, dev) as net, autocast(dev, settings.precision):  # float32, or 16-bit passes
        check_finite_weights(net)
        groups = unit_groups(net, x[:1].to(dev, torch.float32), settings)
        means = None
        if "mean" in settings.modes:
            ref = x if reference_images is None else torch.as_tensor(reference_images)
            blocks = list(dict.fromkeys(g.block for g in groups))
            means = unit_means(net, ref, blocks, settings.batch_size, dev)

        def outcome() -> tuple[np.ndarray, np.ndarray]:
            return per_sample_outcome(net, x, targets, active, settings.batch_size, dev, reduction)

        base_correct, base_loss = outcome()
        rows = []
        jobs = [(g, m) for g in groups for m in settings.modes]
        for group, mode in progress_bar(jobs, desc="ablations", disable=not progress):
            with ablated(net, group, mode, means):
                correct, loss = outcome()
            unit = {
                "block": group.block,
                "group": group.group,
                "channel_start": group.channel_start,
                "channel_stop": group.channel_stop,
                "n_channels": group.n_channels,
                "mode": mode,
            }
            base = (base_correct, base_loss)
            rows += cohort_rows({**(context or {}), **unit}, cohorts, base, (correct, loss), not reduction)
    return pd.DataFrame(rows)


def _classified(
    images: torch.Tensor, labels: np.ndarray, active_classes: np.ndarray, new_classes: np.ndarray
) -> tuple[torch.Tensor, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A classifier's evaluation samples: the images of active classes, their targets (positions
    among the active classes), the active classes, and the old / new / all cohorts."""
    labels = np.asarray(labels, dtype=np.int64)
    active = np.asarray(active_classes, dtype=np.int64)
    new = np.asarray(new_classes, dtype=np.int64)
    stray = np.setdiff1d(new, active)
    if len(stray):
        raise ConfigError(f"new classes {stray.tolist()} are not among the active classes {active.tolist()}")
    keep = np.flatnonzero(np.isin(labels, active))
    if len(keep) == 0:
        raise ConfigError(
            f"no evaluation image belongs to an active class ({active.tolist()[:10]}...); check the "
            "class order and the epoch."
        )
    y = labels[keep]
    cohorts = {"old": ~np.isin(y, new), "new": np.isin(y, new), "all": np.ones(len(y), dtype=bool)}
    return images[torch.as_tensor(keep)], positions_in(y, active), active, cohorts


def cohort_rows(
    unit: Mapping[str, object],
    cohorts: Mapping[str, np.ndarray],
    base: tuple[np.ndarray, np.ndarray],
    ablated: tuple[np.ndarray, np.ndarray],
    accuracy: bool = True,
) -> list[dict]:
    """One table row per cohort with samples: ``unit``'s columns, then n_samples and accuracy and
    loss intact, ablated and their difference; ``base``/``ablated`` are per-sample (correct, loss).
    Without ``accuracy`` (a regression) the loss columns only."""
    rows = []
    for cohort, sel in cohorts.items():
        if not sel.any():
            continue
        row = {**unit, "cohort": cohort, "n_samples": int(sel.sum())}
        if accuracy:
            acc_base, acc = float(base[0][sel].mean()), float(ablated[0][sel].mean())
            row.update(accuracy_base=acc_base, accuracy=acc, delta_accuracy=acc - acc_base)
        loss_base, loss = float(base[1][sel].mean()), float(ablated[1][sel].mean())
        rows.append({**row, "loss_base": loss_base, "loss": loss, "delta_loss": loss - loss_base})
    return rows


def evaluation_images(data: Dataset, split: str, run: str = "<run>") -> tuple[torch.Tensor, np.ndarray]:
    """Normalised images and labels the ablations are measured on: the test split or the holdout.

    Raises:
        ConfigError: ``split: holdout`` for a data set without a holdout (naming the keys to fix).
    """
    if split == "test":
        return data.normalized("test"), data.test_labels
    held = np.flatnonzero(data.holdout)
    if len(held) == 0:
        raise ConfigError(
            f"runs.{run}.ablation.split: holdout, but the data set has no holdout; set "
            f"runs.{run}.data.holdout_per_class or ablation.split: test."
        )
    return data.normalized("train", held), data.train_labels[held]


def reference_images(
    data: Dataset, active_classes: np.ndarray, mean_samples: int | None
) -> torch.Tensor | None:
    """Images whose mean activations the mean ablation uses: training images the model was trained
    on (outside the holdout, of the active classes), evenly spaced, at most ``mean_samples`` of
    them; None without mean ablation (``mean_samples`` None or 0)."""
    if not mean_samples:
        return None
    if data.is_regression:  # every training sample outside the holdout
        pool = np.flatnonzero(~data.holdout)
    else:
        pool = np.flatnonzero(~data.holdout & np.isin(data.train_labels, active_classes))
    take = np.unique(np.linspace(0, len(pool) - 1, min(mean_samples, len(pool))).round())
    return data.normalized("train", pool[take.astype(np.int64)])
