"""K-FAC's covariance pass over training samples (:func:`covariance_sums`): Σ a aᵀ and Σ ds dsᵀ
per tracked layer in float64, and the positions that normalise A (the formulas: module doc of
:mod:`epochlens.influence.factors`). A shard's :class:`CovarianceSums` add up to the whole training
set's. Also what every pass over training samples needs (:class:`SamplePass`): the call's task,
its samples and the tracked layers, on the model's device and compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from epochlens.batches import SampleSource, is_dataset, sample_source
from epochlens.device import model_device
from epochlens.errors import ConfigError
from epochlens.influence.gradients import (
    BatchBackprop,
    Workspace,
    forward_backprop,
    prepared_model,
    resolve_compute_dtype,
    task_batches,
)
from epochlens.influence.layer_selection import select_layers
from epochlens.influence.layers import ActivationCapture, LayerInfo, gram_, symmetrize_
from epochlens.influence.settings import InfluenceSettings
from epochlens.progress import progress_bar
from epochlens.tasks import ClassificationTask, Task, task_from_config

#: The dtype of every sum of the factors (and of each chunk of a batch's tensors that enter them).
F64 = torch.float64


def _check_inputs(images: torch.Tensor, labels: np.ndarray, sample_indices: np.ndarray, what: str) -> None:
    if images.ndim < 2 or len(labels) != len(images) or len(sample_indices) != len(images):
        raise ValueError(
            f"{what}: images {tuple(images.shape)}, labels ({len(labels)},) and sample_indices "
            f"({len(sample_indices)},) must describe the same N samples"
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{what}: labels must be a 1-D integer array")


def check_active_classes(active_classes: np.ndarray | list[int]) -> np.ndarray:
    active = np.asarray(active_classes, dtype=np.int64)
    if active.ndim != 1 or len(active) == 0 or len(np.unique(active)) != len(active):
        raise ConfigError(f"active_classes must be distinct class ids, at least one; got {active}")
    return active


def resolve_task(task: Task | str | None, active_classes: np.ndarray | list[int] | None) -> Task:
    """The task of a call: ``task`` (a Task, a name or an import path), else classification over
    ``active_classes`` (None: all classes)."""
    if task is None:
        if active_classes is not None:
            check_active_classes(active_classes)
        return ClassificationTask(active_classes)
    if active_classes is not None and not isinstance(task, ClassificationTask):
        if not (isinstance(task, str) and task == "classification"):
            raise ConfigError(
                "active_classes were given with a task that is not classification; give the classes to "
                "the classification task, or leave active_classes out."
            )
    return task_from_config(task, active_classes)


def data_source(
    data: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | torch.Tensor | None,
    sample_indices: np.ndarray | None,
    task: Task,
    what: str,
) -> SampleSource:
    """The samples of a call: in-memory ``data`` with ``labels``, or a Dataset/DataLoader (labels None).

    In-memory classification keeps today's contract (labels a 1-D integer array of N class ids).
    """
    if not is_dataset(data) and isinstance(task, ClassificationTask) and labels is not None:
        x = sample_source(data, None, None, what).inputs  # refuses dicts and tuples with the fix
        y = np.asarray(labels)
        idx = np.arange(len(x)) if sample_indices is None else np.asarray(sample_indices)
        _check_inputs(x, y, idx, what)
    return sample_source(data, labels, sample_indices, what)


def resolve_layers(model: nn.Module, settings: InfluenceSettings) -> dict[str, LayerInfo]:
    """The tracked layers of ``model`` under ``settings`` (see :func:`select_layers`)."""
    return select_layers(model, settings.layers, settings.exclude_layers)


@dataclass
class CovarianceSums:
    """The sums of one covariance pass over some training samples (CPU, float64): what a shard of
    the factor fitting computes; shards' sums add up to the whole training set's
    (:meth:`merged`), and :func:`eigendecompose` turns them into K-FAC factors.

    Attributes:
        activation: layer name -> Σ_n Σ_t a_{n,t} a_{n,t}ᵀ (in_dim, in_dim).
        gradient: layer name -> Σ_n Σ_t ds_{n,t} ds_{n,t}ᵀ (out, out).
        positions: layer name -> Σ_n T_n (A's normaliser).
        n_valid: samples in the sums; n_seen: samples the task could score.
        skipped, vanished: global indices left out (NaN/Inf gradients; underflow).
    """

    activation: dict[str, torch.Tensor]
    gradient: dict[str, torch.Tensor]
    positions: dict[str, float]
    n_valid: int
    n_seen: int
    skipped: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)

    @staticmethod
    def merged(parts: list[CovarianceSums]) -> CovarianceSums:
        """The sums of several disjoint shards, added in the order given."""
        if not parts:
            raise ValueError("no covariance sums to merge")
        first = parts[0]
        out = CovarianceSums(
            {n: t.clone() for n, t in first.activation.items()},
            {n: t.clone() for n, t in first.gradient.items()},
            dict(first.positions),
            first.n_valid,
            first.n_seen,
            list(first.skipped),
            list(first.vanished),
        )
        for part in parts[1:]:
            if list(part.activation) != list(out.activation):
                raise ValueError(f"shards of other layers: {list(part.activation)} vs {list(out.activation)}")
            for n in out.activation:
                out.activation[n] += part.activation[n]
                out.gradient[n] += part.gradient[n]
                out.positions[n] += part.positions[n]
            out.n_valid += part.n_valid
            out.n_seen += part.n_seen
            out.skipped += part.skipped
            out.vanished += part.vanished
        return out


class SamplePass:
    """What a pass over training samples needs: task, samples, layers, device, dtype, batches."""

    def __init__(self, model, images, labels, active_classes, settings, sample_indices, device, task, what):
        self.settings = settings or InfluenceSettings()
        self.task = resolve_task(task, active_classes)
        self.source = data_source(images, labels, sample_indices, self.task, what)
        self.layers = resolve_layers(model, self.settings)
        self.model = model
        self.device = model_device(model, device)
        self.dtype = resolve_compute_dtype(model, self.settings.compute_dtype)
        self.indices = self.source.indices

    def batches(self, net: nn.Module, desc: str, progress: bool):
        s = self.settings
        bar = progress_bar(total=len(self.source), unit="sample", disable=not progress, desc=desc)
        with ActivationCapture(self.layers) as capture:
            for pos, inputs, targets in task_batches(
                self.source, self.task, s.factor_batch_size, self.device, self.dtype
            ):
                bp = forward_backprop(
                    net, capture, self.task, inputs, targets, s.fisher, s.seed, self.indices[pos]
                )
                yield pos, bp
                bar.update(len(pos))
        bar.close()


def covariance_sums(
    model: nn.Module,
    images: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | torch.Tensor | None = None,
    active_classes: np.ndarray | None = None,
    settings: InfluenceSettings | None = None,
    sample_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    task: Task | str | None = None,
) -> CovarianceSums:
    """K-FAC's covariance sums over these samples (a shard of the training set, or all of it).

    Arguments as :func:`fit_factors`; ``sample_indices`` are the samples' global indices (the true
    Fisher's draws depend on them, so a shard draws what the whole pass would). No sample to score,
    or none valid, is not an error here (a shard may hold none); :func:`eigendecompose` checks.
    """
    p = SamplePass(
        model, images, labels, active_classes, settings, sample_indices, device, task, "fit_factors"
    )
    dev = p.device
    a_sum = {n: torch.zeros(i.in_dim, i.in_dim, dtype=F64, device=dev) for n, i in p.layers.items()}
    s_sum = {n: torch.zeros(i.out_dim, i.out_dim, dtype=F64, device=dev) for n, i in p.layers.items()}
    positions = {n: torch.zeros((), dtype=F64, device=dev) for n in p.layers}
    out = CovarianceSums({}, {}, {}, 0, 0)
    workspace = Workspace()
    with prepared_model(model, p.layers, dev, p.dtype) as net:
        for pos, bp in p.batches(net, "covariances", progress):
            ok = bp.usable
            out.skipped += p.indices[pos][~bp.valid.cpu().numpy()].tolist()
            out.vanished += p.indices[pos][bp.vanished.cpu().numpy()].tolist()
            out.n_valid += int(ok.sum())
            out.n_seen += len(pos)
            for n in p.layers:
                positions[n] += bp.positions[n][ok].sum()
                _fold_covariances(a_sum[n], s_sum[n], bp, n, ok, workspace)
    for t in (*a_sum.values(), *s_sum.values()):
        symmetrize_(t)
    out.activation = {n: t.cpu() for n, t in a_sum.items()}
    out.gradient = {n: t.cpu() for n, t in s_sum.items()}
    out.positions = {n: float(t) for n, t in positions.items()}
    return out


def _fold_covariances(
    a_sum: torch.Tensor, s_sum: torch.Tensor, bp: BatchBackprop, name: str, rows: torch.Tensor, ws: Workspace
) -> None:
    """Add one layer's Σ a aᵀ and Σ ds dsᵀ over the batch's ``rows`` to the sums (upper triangles,
    float64), a chunk of samples at a time written into ``ws``: the layer's float64 inputs are never
    all formed at once, nor allocated anew for each chunk."""
    for a, ds in bp.chunks(name, F64, rows, workspace=ws):
        gram_(a_sum, a.reshape(-1, a.shape[-1]))
        for d in ds:
            gram_(s_sum, d.reshape(-1, d.shape[-1]))
