"""Fitting the per-layer curvature factors: covariances (float64), eigendecompositions, corrections.

For layer l with per-sample inputs a_{n,t} (in_dim,) and output gradients ds_{n,t} (out,) at
positions t = 1..T (see :mod:`epochlens.influence.layers`) and N valid samples:

    A = 1/(Σ_n T_n) Σ_n Σ_t a_{n,t} a_{n,t}ᵀ      (in_dim, in_dim)   activation covariance
    S = 1/N     Σ_n Σ_t ds_{n,t} ds_{n,t}ᵀ        (out, out)         pre-activation-gradient covariance

so that S ⊗ A approximates the layer's block of the GGN (1/N) Σ_n vec(G_n) vec(G_n)ᵀ, exactly for
a Linear layer whose output Hessian is the same for every sample, and under KFC's spatial
assumptions for a convolution (the T in A's normaliser: S ⊗ A = T·Γ ⊗ Ω of Grosse & Martens).
T_n counts the positions of sample n: image positions of a convolution, the real (not padding)
tokens of a layer with a token dimension, summed over the calls of a layer called several times.
ds are drawn per the Fisher type from the task's loss (true: targets sampled from the model;
expected: the output Hessian's vectors; empirical: the sample's own targets).

EK-FAC's correction (George et al. 2018) refits the eigenvalues in the Kronecker eigenbasis:

    Λ[i, j] = 1/N Σ_n (Q_Sᵀ G_n Q_A)[i, j]²                                       (out, in_dim)

The diagonal method keeps D = 1/N Σ_n G_n² (out, in_dim). All sums run in float64 whatever the
model's dtype; samples with NaN/Inf in any tracked quantity, or whose gradients vanished in the
compute dtype, are left out of every sum and reported.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from epochlens.batches import SampleSource, is_dataset, sample_source
from epochlens.device import model_device
from epochlens.errors import ConfigError, NoFiniteSamplesError
from epochlens.influence.eigen import symmetric_eigh
from epochlens.influence.gradients import (
    forward_backprop,
    prepared_model,
    resolve_compute_dtype,
    task_batches,
)
from epochlens.influence.layers import (
    ActivationCapture,
    LayerInfo,
    per_sample_gradient,
    rotated_gradient,
    select_layers,
)
from epochlens.influence.settings import InfluenceSettings
from epochlens.progress import progress_bar
from epochlens.tasks import ClassificationTask, Task, task_from_config


@dataclass
class LayerFactors:
    """Fitted curvature of one layer (CPU tensors, float64).

    Attributes:
        name, kind, out_dim, in_dim, has_bias: the layer (gradient matrices are (out_dim, in_dim)).
        n_samples: valid samples in the sums.
        activation_cov: A (in_dim, in_dim) (kfac, ekfac).
        gradient_cov: S (out_dim, out_dim) (kfac, ekfac).
        activation_values, activation_vectors: eigenpairs of A, (in_dim,), (in_dim, in_dim).
        gradient_values, gradient_vectors: eigenpairs of S, (out_dim,), (out_dim, out_dim).
        corrected: EK-FAC eigenvalues Λ (out_dim, in_dim).
        diagonal: D (out_dim, in_dim) (diagonal method).
        solver: which eigensolvers ran, per factor.
        min_raw: smallest eigenvalue of A and S before clamping at 0.
    """

    name: str
    kind: str
    out_dim: int
    in_dim: int
    has_bias: bool
    n_samples: int = 0
    activation_cov: torch.Tensor | None = None
    gradient_cov: torch.Tensor | None = None
    activation_values: torch.Tensor | None = None
    activation_vectors: torch.Tensor | None = None
    gradient_values: torch.Tensor | None = None
    gradient_vectors: torch.Tensor | None = None
    corrected: torch.Tensor | None = None
    diagonal: torch.Tensor | None = None
    solver: dict[str, str] = field(default_factory=dict)
    min_raw: dict[str, float] = field(default_factory=dict)

    def eigenvalues(self, method: str) -> torch.Tensor | None:
        """Eigenvalues (out_dim, in_dim) of this layer's curvature under ``method`` (None: identity)."""
        if method == "ekfac":
            return self.corrected
        if method == "kfac":
            return torch.outer(self.gradient_values, self.activation_values)
        if method == "diagonal":
            return self.diagonal
        return None


@dataclass
class InfluenceFactors:
    """Fitted factors of every tracked layer, plus what they were fitted on.

    Attributes:
        method, fisher: as in the settings.
        layers: layer name -> :class:`LayerFactors`, in module order.
        skipped: (K,) int64 global indices of samples left out for NaN/Inf gradients.
        n_samples: valid samples in the sums.
        key: the cache key (see :func:`epochlens.influence.io.factor_cache_key`); {} if not given.
        timings: seconds per stage ("covariances", "eigendecomposition", "corrections").
        fit_settings: the settings they were fitted with (:meth:`InfluenceSettings.factor_key`).
        underflow: (K,) int64 global indices left out because their gradients vanished in the
            compute dtype (see :mod:`epochlens.influence.gradients`).
        compute_dtype: dtype of the forward/backward passes they were fitted with ("" if unknown).
    """

    method: str
    fisher: str
    layers: dict[str, LayerFactors]
    skipped: np.ndarray
    n_samples: int
    key: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    fit_settings: dict = field(default_factory=dict)
    underflow: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    compute_dtype: str = ""

    def settings(self, **overrides) -> InfluenceSettings:
        """Settings that match these factors (method, Fisher, layers, ...), with ``overrides``."""
        fit = {k: v for k, v in self.fit_settings.items() if k in InfluenceSettings.__dataclass_fields__}
        fit = {k: v for k, v in fit.items() if v is not None}
        return InfluenceSettings(**{**fit, "method": self.method, "fisher": self.fisher, **overrides})


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


def _report_skipped(skipped: list[int], what: str) -> np.ndarray:
    arr = np.asarray(sorted(set(skipped)), dtype=np.int64)
    if len(arr):
        shown = arr[:20].tolist()
        more = f" and {len(arr) - 20} more" if len(arr) > 20 else ""
        warnings.warn(
            f"influence: {len(arr)} sample(s) with NaN/Inf gradients left out of the {what}: "
            f"indices {shown}{more}. Check these images (and the model's output on them).",
            stacklevel=3,
        )
    return arr


def _report_vanished(vanished: list[int], what: str, dtype: torch.dtype) -> np.ndarray:
    arr = np.asarray(sorted(set(vanished)), dtype=np.int64)
    if len(arr):
        shown = arr[:20].tolist()
        more = f" and {len(arr) - 20} more" if len(arr) > 20 else ""
        warnings.warn(
            f"influence: {len(arr)} sample(s) whose loss gradient is non-zero but whose tracked layers' "
            f"gradients all vanished in {str(dtype).replace('torch.', '')} (underflow) left out of the "
            f"{what} (NaN, not 0): indices {shown}{more}. Use compute_dtype float32 or float64.",
            stacklevel=3,
        )
    return arr


def fit_factors(
    model: nn.Module,
    images: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | torch.Tensor | None = None,
    active_classes: np.ndarray | None = None,
    settings: InfluenceSettings | None = None,
    sample_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    key: dict | None = None,
    progress: bool = False,
    task: Task | str | None = None,
) -> InfluenceFactors:
    """Fit the curvature factors of ``settings.method`` on a training set.

    Args:
        model: the network (used in place, in eval mode; restored afterwards).
        images: (N, ...) in-memory training inputs (moved to the device batch by batch), or a
            Dataset/DataLoader whose items/batches carry inputs and targets (see :mod:`epochlens.batches`).
        labels: (N,) targets of in-memory inputs (class ids for classification); None with a dataset.
            Samples the task cannot score (a class that is not active) are not used.
        active_classes: class ids of a classification task (restricted logits, in this order; None:
            all classes). Ignored when ``task`` is given.
        settings: method, Fisher type, layers, batch size, ... (defaults: EK-FAC, true Fisher).
        sample_indices: (N,) global indices (for reports and the true Fisher's draws); default arange.
        device: "auto", "cpu", "cuda", ... or None for the model's device.
        key: cache key to store with the factors (see :func:`epochlens.influence.io.factor_cache_key`).
        progress: tqdm bars over batches.
        task: the loss (:mod:`epochlens.tasks`: a Task, a built-in name or an import path); None:
            classification over ``active_classes``.

    Returns:
        :class:`InfluenceFactors` (CPU, float64). For ``identity`` no data pass is made.

    Raises:
        NoFiniteSamplesError: no sample with finite gradients; EigenError, LayerSelectionError.
    """
    settings = settings or InfluenceSettings()
    task = resolve_task(task, active_classes)
    source = data_source(images, labels, sample_indices, task, "fit_factors")
    layers = resolve_layers(model, settings)
    factors = {n: LayerFactors(n, i.kind, i.out_dim, i.in_dim, i.has_bias) for n, i in layers.items()}
    result = InfluenceFactors(
        settings.method,
        settings.fisher,
        factors,
        np.zeros(0, np.int64),
        0,
        key or {},
        fit_settings=settings.factor_key(),
    )
    if settings.method == "identity":
        return result

    device = model_device(model, device)
    dtype = resolve_compute_dtype(model, settings.compute_dtype)
    result.compute_dtype = str(dtype).replace("torch.", "")
    indices = source.indices

    def batches(net: nn.Module, desc: str):
        bar = progress_bar(total=len(source), unit="sample", disable=not progress, desc=desc)
        with ActivationCapture(layers) as capture:
            for pos, inputs, targets in task_batches(source, task, settings.factor_batch_size, device, dtype):
                bp = forward_backprop(
                    net, capture, task, inputs, targets, settings.fisher, settings.seed, indices[pos]
                )
                yield pos, bp
                bar.update(len(pos))
        bar.close()

    f64 = torch.float64
    skipped: list[int] = []
    vanished: list[int] = []
    n_valid = 0
    n_seen = 0
    with prepared_model(model, layers, device, dtype) as net:
        t0 = time.perf_counter()
        if settings.method in ("kfac", "ekfac"):
            a_sum = {n: torch.zeros(i.in_dim, i.in_dim, dtype=f64, device=device) for n, i in layers.items()}
            s_sum = {
                n: torch.zeros(i.out_dim, i.out_dim, dtype=f64, device=device) for n, i in layers.items()
            }
            positions = {n: torch.zeros((), dtype=f64, device=device) for n in layers}
            for pos, bp in batches(net, "covariances"):
                ok = bp.usable
                skipped += indices[pos][~bp.valid.cpu().numpy()].tolist()
                vanished += indices[pos][bp.vanished.cpu().numpy()].tolist()
                n_valid += int(ok.sum())
                n_seen += len(pos)
                for n in layers:
                    a = bp.inputs[n][ok].to(f64)
                    positions[n] += bp.positions[n][ok].sum()
                    a = a.reshape(-1, a.shape[-1])
                    a_sum[n] += a.T @ a
                    for d in bp.output_gradients(n, f64, rows=ok):
                        d = d.reshape(-1, d.shape[-1])
                        s_sum[n] += d.T @ d
            _require_samples(n_valid, n_seen)
            result.timings["covariances"] = _elapsed(t0, device)
            t0 = time.perf_counter()
            eig_device = device if settings.eigh_device == "auto" else torch.device("cpu")
            for n, lf in factors.items():
                lf.n_samples = n_valid
                count = float(positions[n])
                lf.activation_cov = (a_sum.pop(n) / (count if count > 0 else 1.0)).cpu()
                lf.gradient_cov = (s_sum.pop(n) / n_valid).cpu()
                for short, what, cov in (
                    ("A", "activation covariance A", lf.activation_cov),
                    ("S", "pre-activation-gradient covariance S", lf.gradient_cov),
                ):
                    e = symmetric_eigh(cov, f"layer {n!r}: {what}", eig_device, settings.max_device_eigh_dim)
                    lf.solver[short], lf.min_raw[short] = e.solver, e.min_raw
                    if short == "A":
                        lf.activation_values, lf.activation_vectors = e.values, e.vectors
                    else:
                        lf.gradient_values, lf.gradient_vectors = e.values, e.vectors
            result.timings["eigendecomposition"] = _elapsed(t0, device)

        if settings.method in ("ekfac", "diagonal"):
            t0 = time.perf_counter()
            sums = {n: torch.zeros(i.out_dim, i.in_dim, dtype=f64, device=device) for n, i in layers.items()}
            rot = {}
            if settings.method == "ekfac":
                rot = {
                    n: (lf.gradient_vectors.to(device), lf.activation_vectors.to(device))
                    for n, lf in factors.items()
                }
            first_pass = settings.method == "diagonal"
            n_corr, n_seen = 0, 0
            for pos, bp in batches(net, "eigenvalue corrections" if rot else "diagonal"):
                ok = bp.usable
                if first_pass:
                    skipped += indices[pos][~bp.valid.cpu().numpy()].tolist()
                    vanished += indices[pos][bp.vanished.cpu().numpy()].tolist()
                n_corr += int(ok.sum())
                n_seen += len(pos)
                for n in layers:
                    for a, ds in bp.factored(n, f64, rows=ok):
                        g = rotated_gradient(a, ds, *rot[n]) if rot else per_sample_gradient(a, ds)
                        sums[n] += (g * g).sum(0)
            _require_samples(n_corr, n_seen)
            for n, lf in factors.items():
                value = (sums.pop(n) / n_corr).cpu()
                if rot:
                    lf.corrected = value
                else:
                    lf.diagonal, lf.n_samples = value, n_corr
            n_valid = n_corr
            result.timings["corrections" if rot else "diagonal"] = _elapsed(t0, device)
    result.skipped = _report_skipped(skipped, "curvature factors")
    result.underflow = _report_vanished(vanished, "curvature factors", dtype)
    result.n_samples = n_valid
    return result


def _require_samples(n_valid: int, n_total: int) -> None:
    if n_total == 0:
        raise NoFiniteSamplesError(
            "fit_factors: no training sample can be scored by the task (for classification: no label "
            "of an active class). Check the labels and the active classes."
        )
    if n_valid == 0:
        raise NoFiniteSamplesError(
            f"fit_factors: all {n_total} samples have NaN/Inf or vanishing gradients; the inputs or the "
            "checkpoint are broken (check for NaN images, overflowing inputs, or use compute_dtype float32)."
        )


def _elapsed(t0: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
