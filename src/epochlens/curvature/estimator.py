"""Per-image input-loss curvature (Hutchinson estimator with Rademacher directions).

Definitions, for one sample x (C, H, W) with class y, a model f in eval mode and temperature T:

    g(x) = ∇ₓ ℓ(f(x) / T, y)

where ℓ is the per-sample cross-entropy over the logits of the active classes only (the classes
the checkpoint was trained on; see :func:`epochlens.models.networks.restrict_logits`) and the target is
the position of y among them (:func:`epochlens.models.networks.positions_in`). With n Rademacher directions
vᵢ (entries ±1, shape of x) and a step h:

    curvature(x)       = (1/n) Σᵢ ‖g(x + h vᵢ) − g(x)‖₂        (norm "l2")
                         (1/n) Σᵢ ‖g(x + h vᵢ) − g(x)‖₂²       (norm "l2_squared")
    directional_eig(x) = (1/n) Σᵢ (h vᵢ) · (g(x + h vᵢ) − g(x))

Mode "exact" replaces the finite difference g(x + h v) − g(x) by h·H v, H the Hessian of the
per-sample loss with respect to the input, computed by a Hessian-vector product (double backward).
Since g(x + hv) − g(x) = h H v + O(h²), the finite difference converges to it linearly in h.

The same pass also gives the per-sample loss ℓ (nats), the input-gradient norm ‖g(x)‖₂ and whether
the sample is classified correctly (argmax of the restricted logits equals the target).

Properties the implementation guarantees:

* Gradients come from the *sum* of per-sample losses, never the batch mean: in eval mode samples do
  not interact, so ∇ₓ of the sum holds each sample's own gradient and no score depends on the
  batch size.
* Directions are a pure function of (seed, global sample index, direction number, element): a
  SplitMix64 stream keyed by (seed, index), see :func:`rademacher_directions`. Any batch size,
  shard or process count sees the same directions, on any device and torch version.
* g(x) is computed once per sample; the B·n perturbed inputs x + h vᵢ of a batch go through one
  forward and one backward (in chunks of at most ``max_batch`` rows), with one device-to-host copy
  of the results per batch. TF32 is switched off while computing (and restored afterwards): its
  10-bit mantissa would swamp the finite difference.

Text (a transformer on token ids, given with ``tokens``): x is the sample's input embeddings
(T, D), the rows of the model's token-embedding matrix (``get_input_embeddings()``) for its ids.
The model runs on its ids and attention mask as always, with the embedding lookup's output
replaced by x (a forward hook): position embeddings, layer norms and everything after the lookup
are part of f, and a classifier that reads the last non-padding token finds it from the ids.
Directions are Rademacher on the real tokens only
(zero on padding): sample k's stream covers its own len_k x D entries, in position order, so the
directions, like every result, do not depend on how much padding the data set adds or on which
side. The padding's embeddings reach no real token (the attention mask), so g is zero there.

Causal language models (``labels`` (N, L), token labels with -100 where nothing is predicted,
:mod:`epochlens.outcome`): ℓ is the mean negative log-likelihood of the sample's target tokens under
the logits divided by T (the logits at position t predict the token at t + 1), transformers' own
loss of that sample alone when T = 1; correct is exact match (every target token the argmax). x is
the input embeddings of all its real tokens (prompt and target), as for a text classifier. A sample
without a target token is not computed (NaN), like a sample of an inactive class.

Text-to-text (encoder-decoder) models (``tokens`` also hold the decoder ``labels`` (N, T), which
the model shifts into its decoder inputs; ``labels`` are the same array): ℓ is the mean NLL of the
decoder's target tokens (the logits at position t predict label t), transformers' own loss of that
sample alone when T = 1. x is the input embeddings of the encoder's real tokens (the prompt), given
to the model as ``inputs_embeds``: the decoder's embedding lookup (the same matrix in T5) stays a
lookup of its own inputs.

Regression (``labels`` float targets (N,) or (N, D), the model's outputs z (N, D)): ℓ is the
squared error :func:`epochlens.outcome.squared_error` (mean or sum over a sample's D values, the
run's task; no temperature), every sample is computed, and correct means ℓ ≤ ``loss_threshold``
(:func:`regression_threshold`: a tolerance times the loss of predicting the training targets' mean).

The two modes measure different things on ReLU networks. Their input gradient is piecewise
constant in the ReLU pattern, H holds only the softmax curvature (ReLU'' = 0 almost everywhere),
and a step of h = 1e-3 along a Rademacher direction (length h·sqrt(C·H·W), 0.055 on CIFAR) flips
many ReLUs: the finite difference measures those gradient jumps as well. On a randomly initialised
ResNet-18 (saturated softmax) the finite-difference curvature is ~0.3, the exact one 1e-12..1e-9.
The finite difference is the estimator of Garg et al.; "exact" is the h -> 0 limit.

Rounding: float32 results depend on rounding wherever a pre-activation lies within rounding
distance of a ReLU kink: two float32 computations that differ only in rounding (another chunk
size, convolution kernel or device) can put it on different sides, and the gradient jumps. On a
randomly initialised ResNet-18, float32 and float64 curvature differ by 1e-4 to 1e-3 relative.
Float64 results agree across batch sizes, chunk sizes and shards to float32 output precision.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from epochlens.curvature.checks import (
    check_arguments,
    check_finite_images,
    check_finite_results,
    check_outputs,
)
from epochlens.curvature.directions import rademacher_directions, token_directions
from epochlens.curvature.settings import CurvatureSettings
from epochlens.device import device_for_dtype, model_device
from epochlens.models.layers import check_finite_weights
from epochlens.models.networks import positions_in, restrict_logits
from epochlens.outcome import IGNORE_INDEX, sequence_outcome, shifts, squared_error
from epochlens.progress import progress_bar

RESULT_KEYS = ("curvature", "directional_eig", "loss", "grad_norm", "correct")

# Rows per forward/backward when max_batch is None, as input elements per chunk. On CPUs, chunks of
# ~1e5 input elements (42 CIFAR images) keep activations in cache: per-row time on ResNet-18 was
# 1.8x lower than with 256-row chunks (2-core AMD EPYC). GPUs want large chunks; 2**21 elements
# (682 CIFAR rows, ~5 GB of ResNet-18 activations in float32) is a guess not yet measured, and an
# out-of-memory error halves it (see _RowChunks).
_AUTO_CHUNK_ELEMENTS = {"cpu": 1 << 17, "accelerator": 1 << 21}


@contextlib.contextmanager
def full_fp32_precision() -> Iterator[None]:
    """Switch TF32 (and reduced-precision oneDNN float32) off inside the block, then restore.

    Uses the ``fp32_precision`` flags where torch has them (>= 2.9): mixing them with the legacy
    ``allow_tf32`` flags makes torch raise, so the legacy flags are used only on older versions.
    """
    flags = [
        (getattr(torch.backends.cuda, "matmul", None), "fp32_precision"),
        (getattr(getattr(torch.backends, "cudnn", None), "conv", None), "fp32_precision"),
        (getattr(getattr(torch.backends, "mkldnn", None), "matmul", None), "fp32_precision"),
        (getattr(getattr(torch.backends, "mkldnn", None), "conv", None), "fp32_precision"),
    ]
    flags = [(obj, name) for obj, name in flags if obj is not None and hasattr(obj, name)]
    if not flags:  # torch < 2.9
        flags = [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]
        off = False
    else:
        off = "ieee"
    saved = [getattr(obj, name) for obj, name in flags]
    try:
        for obj, name in flags:
            setattr(obj, name, off)
        yield
    finally:
        for (obj, name), value in zip(flags, saved, strict=True):
            setattr(obj, name, value)


def per_sample_curvature(
    model: nn.Module,
    images: torch.Tensor | np.ndarray,
    labels: np.ndarray,
    sample_indices: np.ndarray,
    active_classes: np.ndarray,
    settings: CurvatureSettings | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    tokens: Mapping[str, torch.Tensor] | None = None,
    loss_threshold: float | None = None,
) -> dict[str, np.ndarray]:
    """Curvature, directional eigenvalue, loss, gradient norm and correctness of every sample.

    Args:
        model: classifier mapping (B, C, H, W) to logits over all classes (B, num_classes). It is
            not modified: a copy in eval mode, without parameter gradients, is used on ``device``.
            The computation runs in the dtype of its parameters (float32 or float64).
        images: (N, C, H, W) normalised inputs (any device; moved batch by batch), or rows read
            when indexed (:class:`epochlens.data.rows.NormalizedRows`: ``shape``, ``dtype``, ``x[rows]``).
        labels: (N,) class ids, a causal LM's token labels (N, L) (with ``tokens``), or a
            regression's float targets (N,) / (N, D) (module doc).
        sample_indices: (N,) global indices of the samples in the data set; with
            ``settings.seed`` they fix the directions, so results do not depend on sharding.
        active_classes: class ids the model was trained on (restricted logits, in this order);
            unused for a causal LM.
        settings: estimator settings (defaults: h=1e-3, n=10, T=1, l2, finite difference).
        device: "auto", "cpu", "cuda", ... or a torch.device; None: the model's device.
        progress: show a progress bar (tqdm) over samples.
        tokens: a text model's ``input_ids`` and ``attention_mask`` (N, T) (a text-to-text model's
            encoder inputs, with its decoder ``labels``): ``images`` are then their input
            embeddings (N, T, D), what the curvature is taken with respect to (module doc).
        loss_threshold: regression: a sample is correct (learned) when its loss is at most this
            (:func:`regression_threshold`); None: no sample is.

    Returns:
        dict of length-N numpy arrays: ``curvature``, ``directional_eig`` (see module doc; input
        units of the loss gradient, i.e. nats per input unit), ``loss`` (nats), ``grad_norm``
        (‖g(x)‖₂) as float32, and ``correct`` as bool. Samples whose label is not an active
        class (a causal LM's: without a target token) are not computed: NaN (and ``correct`` False).

    Raises:
        EpochlensError: NaN/Inf in the active samples' images (naming their indices), in the
            model's weights (naming the parameters), or in the results (naming the samples).
    """
    settings = settings or CurvatureSettings()
    images = torch.as_tensor(images) if isinstance(images, np.ndarray) else images
    labels = np.asarray(labels)
    sample_indices = np.asarray(sample_indices)
    active_classes = np.asarray(active_classes, dtype=np.int64)
    n_samples = len(images)
    regression, lm, seq2seq = check_arguments(
        images, labels, sample_indices, active_classes, settings, tokens
    )
    targets, active = _scored_samples(labels, active_classes, n_samples, regression, lm, seq2seq)
    out = _empty_results(n_samples)
    net, dtype, device = _evaluation_copy(model, images, device)
    check_finite_images(images, active, sample_indices)
    if len(active) == 0:
        return out
    batches = _Batches(images, targets, tokens, regression, dtype, device)
    chunks = _RowChunks(settings.max_batch or default_max_batch(device, math.prod(batches.shape)))
    active_idx = torch.as_tensor(active_classes, device=device)
    x, y, t = batches.at(active[:1])  # the model's outputs checked on one sample
    check_outputs(
        _no_grad_forward(net, x, t), active_classes, t, lm, targets[active[:1]] if regression else None
    )
    loss = _Loss(settings, regression, loss_threshold)
    bar = progress_bar(total=len(active), unit="sample", disable=not progress, desc="curvature")
    with full_fp32_precision(), torch.enable_grad():
        for start in range(0, len(active), settings.batch_size):
            rows = active[start : start + settings.batch_size]
            x, y, t = batches.at(rows)
            signs = _batch_directions(settings, sample_indices[rows], batches.shape, t)
            stats = _batch_statistics(net, x, y, signs.to(device), active_idx, settings, chunks, t, loss)
            stats = stats.cpu().numpy()  # the one device-to-host copy per batch
            check_finite_results(stats, sample_indices[rows])
            _store(out, rows, stats)
            bar.update(len(rows))
    bar.close()
    return out


def _empty_results(n_samples: int) -> dict[str, np.ndarray]:
    """NaN results (``correct`` False) for every sample: what a sample not computed keeps."""
    out = {key: np.full(n_samples, np.nan, dtype=np.float32) for key in RESULT_KEYS[:4]}
    out["correct"] = np.zeros(n_samples, dtype=bool)
    return out


def _store(out: dict[str, np.ndarray], rows: np.ndarray, stats: np.ndarray) -> None:
    """A batch's statistics (B, 5) into the results at its rows."""
    for j, key in enumerate(RESULT_KEYS[:4]):
        out[key][rows] = stats[:, j]
    out["correct"][rows] = stats[:, 4] > 0.5


class _Batches:
    """A batch's inputs on the device in the model's dtype, its targets (a regression's in that
    dtype too) and a text model's token rows."""

    def __init__(self, images, targets, tokens, regression: bool, dtype, device) -> None:
        self.images, self.targets, self.tokens = images, targets, tokens
        self.shape = tuple(images.shape[1:])  # one sample's
        self.regression, self.dtype, self.device = regression, dtype, device

    def at(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, Mapping[str, torch.Tensor] | None]:
        x = self.images[torch.as_tensor(rows)].to(device=self.device, dtype=self.dtype)
        y = torch.as_tensor(self.targets[rows], device=self.device)
        if self.regression:
            y = y.to(self.dtype)
        return x, y, _token_rows(self.tokens, torch.as_tensor(rows), self.device)


def _scored_samples(
    labels: np.ndarray, active_classes: np.ndarray, n_samples: int, regression: bool, lm: bool, seq2seq: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(targets, positions of the samples computed): a causal LM's samples with a target token
    (its first position is never one: nothing predicts it), every regression sample with its
    targets as they are, a classifier's samples of the active classes with their positions among
    them."""
    if lm:
        return labels, np.flatnonzero((labels[:, 0 if seq2seq else 1 :] != IGNORE_INDEX).any(1))
    if regression:
        return labels, np.arange(n_samples)
    targets = positions_in(labels, active_classes)
    return targets, np.flatnonzero(targets >= 0)


def _evaluation_copy(
    model: nn.Module, images: torch.Tensor, device: str | torch.device | None
) -> tuple[nn.Module, torch.dtype, torch.device]:
    """A copy of the model in eval mode without parameter gradients on the device, its weights
    checked finite, and the dtype it computes in (its parameters'; a model without weights
    computes in the images' dtype; float64 models on MPS run on the CPU)."""
    tensors = [*model.parameters(), *model.buffers()]
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
    if dtype is None:
        dtype = images.dtype if images.is_floating_point() else torch.get_default_dtype()
    device = device_for_dtype(model_device(model, device), dtype)
    net = copy.deepcopy(model).to(device).eval().requires_grad_(False)
    check_finite_weights(net)
    return net, dtype, device


def _batch_directions(
    settings: CurvatureSettings,
    indices: np.ndarray,
    shape: tuple[int, ...],
    tokens: Mapping[str, torch.Tensor] | None,
) -> torch.Tensor:
    """The batch's Rademacher directions (int8, on the CPU): over the whole input, or on the real
    tokens only (a text model)."""
    if tokens is None:
        return rademacher_directions(settings.seed, indices, shape, settings.n_directions, torch.int8)
    mask = tokens["attention_mask"].cpu()
    return token_directions(settings.seed, indices, mask, shape[-1], settings.n_directions, torch.int8)


def default_max_batch(device: torch.device, sample_numel: int) -> int:
    """Rows per forward/backward used when ``settings.max_batch`` is None."""
    budget = _AUTO_CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "accelerator"]
    return max(1, budget // sample_numel)


class _RowChunks:
    """Runs ``fn(lo, hi)`` over rows in chunks of at most ``rows``.

    On a GPU out-of-memory error the chunk size is halved and the chunk retried (with a warning),
    and the smaller size is kept for later batches. Results do not depend on the chunk size beyond
    float rounding.
    """

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def run(self, total: int, fn: Callable[[int, int], None]) -> None:
        lo = 0
        while lo < total:
            hi = min(lo + self.rows, total)
            try:
                fn(lo, hi)
                lo = hi
                continue
            except torch.cuda.OutOfMemoryError:
                if hi - lo == 1:
                    raise
            # Outside the except block, so the traceback no longer pins the chunk's tensors.
            self.rows = (hi - lo) // 2
            warnings.warn(
                f"curvature: out of memory with {hi - lo} rows per pass, retrying with "
                f"{self.rows}; set max_batch to at most {self.rows} to avoid the retries",
                stacklevel=3,
            )
            torch.cuda.empty_cache()


class _Loss:
    """The per-sample loss the curvature is taken of, and what counts as correct: a classifier's
    cross-entropy over the restricted logits / T (argmax), a causal LM's target tokens' NLL / T
    (exact match), or a regression's squared error (loss at most ``threshold``)."""

    def __init__(self, settings: CurvatureSettings, regression: bool = False, threshold: float | None = None):
        self.temperature, self.regression = settings.temperature, regression
        self.reduction, self.threshold = settings.reduction, threshold

    def __call__(
        self,
        net: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        active_idx: torch.Tensor,
        create_graph: bool = False,
        tokens: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sample losses (R,), whether each sample is correct (R,) and the input gradients
        (R, *shape) at x (a text model's input embeddings of ``tokens``).

        ``x`` must be a leaf tensor that requires grad (the caller keeps it for double backward).
        """
        logits = _forward(net, x, tokens)
        if self.regression:
            losses = squared_error(logits, y, self.reduction)
            correct = losses <= self.threshold if self.threshold is not None else torch.zeros_like(losses)
        elif y.ndim == 2:  # a causal LM: its own branch, the classifiers' operations below stay as they are
            shift = shifts(tokens)  # a text-to-text model's logits line up with its labels
            correct, losses = sequence_outcome(logits / self.temperature, y, keep_dtype=True, shift=shift)
        else:
            restricted = restrict_logits(logits, active_idx)
            losses = F.cross_entropy(restricted / self.temperature, y, reduction="none")
            correct = restricted.detach().argmax(1) == y
        # The sum, not the mean: each sample's gradient is then its own (eval mode, no coupling).
        (grad,) = torch.autograd.grad(losses.sum(), x, create_graph=create_graph)
        return losses, correct, grad


def regression_threshold(targets: np.ndarray, tolerance: float, reduction: str = "mean") -> float:
    """The loss below which a regression sample counts as learned: ``tolerance`` times the mean
    per-sample squared error of always predicting the mean of ``targets`` (the training targets,
    (N,) or (N, D)): ``tolerance`` x the targets' variance averaged (``mean``) or summed (``sum``)
    over the D values."""
    y = np.asarray(targets, dtype=np.float64).reshape(len(targets), -1)
    variance = y.var(axis=0)
    return float(tolerance * (variance.mean() if reduction == "mean" else variance.sum()))


def _batch_statistics(
    net: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    signs: torch.Tensor,
    active_idx: torch.Tensor,
    settings: CurvatureSettings,
    chunks: _RowChunks,
    tokens: Mapping[str, torch.Tensor] | None = None,
    loss: _Loss | None = None,
) -> torch.Tensor:
    """(B, 5) tensor: curvature, directional_eig, loss, grad_norm, correct, for one batch.

    x: (B, *shape) inputs; y: (B,) targets (positions in active_idx), a causal LM's token labels
    (B, L) or a regression's targets; signs: (B, n, *shape) ±1 (0 on padding); tokens: ids and
    attention mask (B, T) of a text model's input embeddings, or None; loss: the per-sample loss
    (default: a classifier's or causal LM's with the settings' temperature).
    """
    n_batch, n_dir, h = len(x), settings.n_directions, settings.h
    exact = settings.mode == "exact"
    loss_and_grad = loss or _Loss(settings)
    g0 = torch.empty(n_batch, x[0].numel(), dtype=x.dtype, device=x.device)
    losses = torch.empty(n_batch, dtype=x.dtype, device=x.device)
    correct = torch.empty(n_batch, dtype=x.dtype, device=x.device)

    def clean(lo: int, hi: int) -> None:  # g(x), loss and correctness, once per sample
        leaf = x[lo:hi].detach().requires_grad_(True)
        t = _token_rows(tokens, slice(lo, hi))
        loss, hit, grad = loss_and_grad(net, leaf, y[lo:hi], active_idx, tokens=t)
        g0[lo:hi] = grad.flatten(1)
        losses[lo:hi] = loss.detach()
        correct[lo:hi] = hit

    # Perturbed rows: row r = (sample r // n, direction r % n); all B*n go through in chunks.
    v_all = signs.reshape(n_batch * n_dir, -1)
    norms = torch.empty(n_batch * n_dir, dtype=x.dtype, device=x.device)
    eigs = torch.empty_like(norms)

    def perturbed(lo: int, hi: int) -> None:
        owner = torch.arange(lo, hi, device=x.device) // n_dir
        v = v_all[lo:hi].to(x.dtype)
        x_rows = x[owner]
        t = _token_rows(tokens, owner)
        if exact:
            leaf = x_rows.requires_grad_(True)
            _, _, grad = loss_and_grad(net, leaf, y[owner], active_idx, True, t)
            # Rows are independent, so the gradient of sum_r v_r·g_r with respect to x_r is H_r v_r.
            (hvp,) = torch.autograd.grad(grad, leaf, grad_outputs=v.view_as(grad))
            delta = h * hvp.flatten(1)
        else:
            leaf = (x_rows + h * v.view_as(x_rows)).requires_grad_(True)
            _, _, grad = loss_and_grad(net, leaf, y[owner], active_idx, tokens=t)
            delta = grad.flatten(1) - g0[owner]
        sq = (delta * delta).sum(1)
        norms[lo:hi] = sq if settings.norm == "l2_squared" else sq.sqrt()
        eigs[lo:hi] = h * (v * delta).sum(1)

    chunks.run(n_batch, clean)
    chunks.run(n_batch * n_dir, perturbed)
    return torch.stack(
        [
            norms.view(n_batch, n_dir).mean(1),
            eigs.view(n_batch, n_dir).mean(1),
            losses,
            g0.norm(dim=1),
            correct,
        ],
        dim=1,
    )


def _token_rows(
    tokens: Mapping[str, torch.Tensor] | None, rows: torch.Tensor | slice, device: torch.device | None = None
) -> dict[str, torch.Tensor] | None:
    if tokens is None:
        return None
    return {k: torch.as_tensor(v)[rows].to(device) for k, v in tokens.items()}


@torch.no_grad()
def _no_grad_forward(
    net: nn.Module, x: torch.Tensor, tokens: Mapping[str, torch.Tensor] | None
) -> torch.Tensor:
    return _forward(net, x, tokens)


def _forward(net: nn.Module, x: torch.Tensor, tokens: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
    """The model at inputs x, or a text model on its tokens with x as its embedding lookup's output
    (an encoder-decoder model: x as the encoder's ``inputs_embeds``)."""
    if tokens is None:
        return net(x)
    if getattr(getattr(net, "config", None), "is_encoder_decoder", False):
        return net(inputs_embeds=x, **{k: v for k, v in tokens.items() if k != "input_ids"})
    handle = net.get_input_embeddings().register_forward_hook(lambda module, inputs, output: x)
    try:
        return net(**tokens)
    finally:
        handle.remove()
