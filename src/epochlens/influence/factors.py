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
compute dtype, are left out of every sum and reported. The covariance pass (A's and S's sums, a
shard at a time): :mod:`epochlens.influence.covariances`.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from epochlens.errors import NoFiniteSamplesError
from epochlens.influence.covariances import (  # noqa: F401 (moved there; importable here too)
    F64,
    CovarianceSums,
    SamplePass,
    check_active_classes,
    covariance_sums,
    data_source,
    resolve_layers,
    resolve_task,
)
from epochlens.influence.eigen import symmetric_eigh
from epochlens.influence.gradients import (
    BatchBackprop,
    Workspace,
    prepared_model,
)
from epochlens.influence.layers import gradient_chunks
from epochlens.influence.settings import InfluenceSettings
from epochlens.tasks import Task


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


@dataclass
class CorrectionSums:
    """The sums of one pass of EK-FAC's eigenvalue correction (Σ_n (Q_Sᵀ G_n Q_A)²) or of the
    diagonal method (Σ_n G_n²) over some training samples, (out, in_dim) per layer, CPU float64;
    shards add up (:meth:`merged`), :func:`apply_corrections` divides by the count."""

    sums: dict[str, torch.Tensor]
    n_valid: int
    n_seen: int
    skipped: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)

    @staticmethod
    def merged(parts: list[CorrectionSums]) -> CorrectionSums:
        """The sums of several disjoint shards, added in the order given."""
        if not parts:
            raise ValueError("no correction sums to merge")
        out = CorrectionSums(
            {n: t.clone() for n, t in parts[0].sums.items()},
            parts[0].n_valid,
            parts[0].n_seen,
            list(parts[0].skipped),
            list(parts[0].vanished),
        )
        for part in parts[1:]:
            if list(part.sums) != list(out.sums):
                raise ValueError(f"shards of other layers: {list(part.sums)} vs {list(out.sums)}")
            for n in out.sums:
                out.sums[n] += part.sums[n]
            out.n_valid += part.n_valid
            out.n_seen += part.n_seen
            out.skipped += part.skipped
            out.vanished += part.vanished
        return out


def _fold_squares(
    out: torch.Tensor, bp: BatchBackprop, name: str, rows: torch.Tensor, rot: tuple | None, ws: Workspace
) -> None:
    """Add one layer's Σ_n (Q_Sᵀ G_n Q_A)² (``rot`` = (Q_S, Q_A)) or Σ_n G_n² (``rot`` None) over the
    batch's ``rows`` to ``out`` (out, in_dim), a chunk of samples at a time (written into ``ws``)."""
    for a, ds in bp.chunks(name, F64, rows, copies=1 if rot is None else 2, workspace=ws):
        for d in ds:
            for _, g in gradient_chunks(a, d, rot):
                out += g.square_().sum(0)


def empty_factors(model: nn.Module, settings: InfluenceSettings, key: dict | None = None) -> InfluenceFactors:
    """Factors of ``settings.method`` with every tracked layer and nothing fitted yet."""
    layers = resolve_layers(model, settings)
    return InfluenceFactors(
        settings.method,
        settings.fisher,
        {n: LayerFactors(n, i.kind, i.out_dim, i.in_dim, i.has_bias) for n, i in layers.items()},
        np.zeros(0, np.int64),
        0,
        key or {},
        fit_settings=settings.factor_key(),
    )


def eigendecompose(
    factors: InfluenceFactors,
    sums: CovarianceSums,
    settings: InfluenceSettings,
    device: str | torch.device = "cpu",
) -> InfluenceFactors:
    """Set A and S of every layer from the (merged) covariance sums and eigendecompose them.

    The layers' factors are independent and solved largest first, each normalised just before its
    solve: the solver's workspace (twice the matrix for LAPACK's syevd) is largest while few results
    are held, which keeps the peak memory ~0.4 GiB lower for ResNet-18 than solving in layer order.
    ``settings.eigh_workers`` threads solve them at once (each on ``device`` up to
    ``settings.max_device_eigh_dim``, else the CPU; see :func:`symmetric_eigh`). The result does not
    depend on the order or the number of workers.

    Raises:
        NoFiniteSamplesError: no valid sample in the sums. EigenError.
    """
    _require_samples(sums.n_valid, sums.n_seen)
    device = torch.device(device)
    eig_device = device if settings.eigh_device == "auto" else torch.device("cpu")
    jobs = [(n, short) for n in factors.layers for short in ("A", "S")]
    dims = {(n, "A"): sums.activation[n].shape[0] for n in factors.layers}
    dims.update({(n, "S"): sums.gradient[n].shape[0] for n in factors.layers})
    jobs.sort(key=lambda job: -dims[job])  # stable: layer order among equal sizes

    def solve(job: tuple[str, str]) -> None:
        n, short = job
        lf = factors.layers[n]
        lf.n_samples = sums.n_valid
        if short == "A":
            count = sums.positions[n]
            cov = lf.activation_cov = sums.activation[n] / (count if count > 0 else 1.0)
            what = "activation covariance A"
        else:
            cov = lf.gradient_cov = sums.gradient[n] / sums.n_valid
            what = "pre-activation-gradient covariance S"
        e = symmetric_eigh(
            cov, f"layer {n!r}: {what}", eig_device, settings.max_device_eigh_dim, settings.eigh_float32_from
        )
        lf.solver[short], lf.min_raw[short] = e.solver, e.min_raw
        if short == "A":
            lf.activation_values, lf.activation_vectors = e.values, e.vectors
        else:
            lf.gradient_values, lf.gradient_vectors = e.values, e.vectors

    workers = max(1, min(settings.eigh_workers, len(jobs)))
    if workers == 1:
        for job in jobs:
            solve(job)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(solve, jobs))
    for lf in factors.layers.values():  # the solvers in a fixed order, whatever the solving order
        lf.solver = {k: lf.solver[k] for k in ("A", "S")}
        lf.min_raw = {k: lf.min_raw[k] for k in ("A", "S")}
    factors.skipped = np.asarray(sorted(set(sums.skipped)), dtype=np.int64)
    factors.underflow = np.asarray(sorted(set(sums.vanished)), dtype=np.int64)
    factors.n_samples = sums.n_valid
    return factors


def correction_sums(
    model: nn.Module,
    factors: InfluenceFactors | None,
    images: torch.Tensor | np.ndarray | Dataset | DataLoader,
    labels: np.ndarray | torch.Tensor | None = None,
    active_classes: np.ndarray | None = None,
    settings: InfluenceSettings | None = None,
    sample_indices: np.ndarray | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    task: Task | str | None = None,
) -> CorrectionSums:
    """EK-FAC's eigenvalue-correction sums in the eigenbasis of ``factors`` (ekfac), or the
    diagonal method's sums of squared gradients (diagonal, ``factors`` None), over these samples.

    Arguments as :func:`fit_factors`. The diagonal pass is the method's only pass: it reports the
    samples it leaves out; EK-FAC's were reported by the covariance pass.
    """
    p = SamplePass(
        model, images, labels, active_classes, settings, sample_indices, device, task, "fit_factors"
    )
    dev = p.device
    ekfac = p.settings.method == "ekfac"
    if ekfac and factors is None:
        raise ValueError("EK-FAC's corrections need the eigendecomposed factors (eigendecompose)")
    rot = {}
    if ekfac:
        rot = {
            n: (lf.gradient_vectors.to(dev), lf.activation_vectors.to(dev))
            for n, lf in factors.layers.items()
        }
    sums = {n: torch.zeros(i.out_dim, i.in_dim, dtype=F64, device=dev) for n, i in p.layers.items()}
    out = CorrectionSums({}, 0, 0)
    workspace = Workspace()
    with prepared_model(model, p.layers, dev, p.dtype) as net:
        for pos, bp in p.batches(net, "eigenvalue corrections" if ekfac else "diagonal", progress):
            ok = bp.usable
            if not ekfac:
                out.skipped += p.indices[pos][~bp.valid.cpu().numpy()].tolist()
                out.vanished += p.indices[pos][bp.vanished.cpu().numpy()].tolist()
            out.n_valid += int(ok.sum())
            out.n_seen += len(pos)
            for n in p.layers:
                _fold_squares(sums[n], bp, n, ok, rot.get(n), workspace)
    out.sums = {n: t.cpu() for n, t in sums.items()}
    return out


def apply_corrections(factors: InfluenceFactors, sums: CorrectionSums) -> InfluenceFactors:
    """Set EK-FAC's corrected eigenvalues (ekfac) or the diagonal (diagonal) from the merged sums.

    Raises:
        NoFiniteSamplesError: no valid sample in the sums.
    """
    _require_samples(sums.n_valid, sums.n_seen)
    for n, lf in factors.layers.items():
        value = sums.sums[n] / sums.n_valid
        if factors.method == "ekfac":
            lf.corrected = value
        else:
            lf.diagonal, lf.n_samples = value, sums.n_valid
    if factors.method == "diagonal":
        factors.skipped = np.asarray(sorted(set(sums.skipped)), dtype=np.int64)
        factors.underflow = np.asarray(sorted(set(sums.vanished)), dtype=np.int64)
    factors.n_samples = sums.n_valid
    return factors


def report_left_out(factors: InfluenceFactors) -> InfluenceFactors:
    """Warn about the samples the fit left out (NaN/Inf gradients; underflow in the compute dtype)."""
    _report_skipped(factors.skipped.tolist(), "curvature factors")
    dtype = _DTYPES.get(factors.compute_dtype, torch.float32)
    _report_vanished(factors.underflow.tolist(), "curvature factors", dtype)
    return factors


_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


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

    The passes, each also callable alone on a shard of the training set (their sums add up):
    :func:`covariance_sums` then :func:`eigendecompose` (kfac, ekfac), :func:`correction_sums` then
    :func:`apply_corrections` (ekfac, diagonal).

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
    p = SamplePass(
        model, images, labels, active_classes, settings, sample_indices, device, task, "fit_factors"
    )
    result = empty_factors(model, settings, key)
    if settings.method == "identity":
        return result
    result.compute_dtype = str(p.dtype).replace("torch.", "")
    args = (images, labels, active_classes, settings, sample_indices, p.device, progress, task)
    if settings.method in ("kfac", "ekfac"):
        t0 = time.perf_counter()
        sums = covariance_sums(model, *args)
        result.timings["covariances"] = _elapsed(t0, p.device)
        t0 = time.perf_counter()
        eigendecompose(result, sums, settings, p.device)
        result.timings["eigendecomposition"] = _elapsed(t0, p.device)
        del sums  # the covariances are the factors now: the corrections' pass runs without their sums
    if settings.method in ("ekfac", "diagonal"):
        t0 = time.perf_counter()
        corr = correction_sums(model, result if settings.method == "ekfac" else None, *args)
        apply_corrections(result, corr)
        result.timings["corrections" if settings.method == "ekfac" else "diagonal"] = _elapsed(t0, p.device)
    return report_left_out(result)


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
