"""Per-sample layer inputs and output gradients of a batch, for the curvature and for the scores.

The loss is the run's task (:mod:`epochlens.tasks`): a per-sample loss ℓ_n(z_n, y_n) of the model's
prediction z, model in eval mode (samples do not interact, so each row of a batched backward is that
sample's own). Back-propagating a vector v (shaped like z) from z gives every tracked layer's output
gradient ds for that vector:

* scores and the empirical Fisher: v = ∂ℓ(z, y)/∂z at the sample's targets y (queries: the task's
  measurement instead of its loss);
* true Fisher: v = w ∂ℓ(z, ŷ)/∂z, ŷ drawn by the task from the model's predictive distribution with
  uniforms that are pure functions of (seed, sample index), so the draw does not depend on batching
  (w = 1 unless the loss is a multiple of an NLL, e.g. a mean over tokens: Task.fisher_weight);
* expected Fisher: the task's vectors v_k with Σ_k v_k v_kᵀ = ∂²ℓ/∂z² (classification: √p_c (p − e_c)
  per class), so that the factors reproduce the GGN Jᵀ H J.

v is computed in float64 from the prediction. Before the backward pass in the compute dtype, each
sample's v is scaled by a power of two that brings its largest entry to [0.5, 1) (exact: no rounding),
and the output gradients are scaled back in float64 where they are used. Without it, p − e_y of a
confident sample (~1e-9) rounds to zero in float16 and the sample's scores come out as exactly 0.
A sample whose v is non-zero but whose tracked gradients all vanish in a compute dtype narrower than
float64 is flagged ``vanished`` (underflow inside the network, or no tracked layer reaches its loss):
callers give it NaN and report it, never a score of 0 as if computed.

A sample whose prediction, v, tracked inputs or output gradients hold NaN/Inf is marked invalid
(its rows are never mixed into another sample's numbers); callers leave it out and report it.

The model is used in place, not copied: :func:`prepared_model` sets eval mode, gradients on the
tracked weights only, and the compute device and dtype, and restores all of it on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from epochlens.batches import SampleSource, select_rows, to_device
from epochlens.errors import LayerSelectionError
from epochlens.influence.layers import (
    ActivationCapture,
    LayerInfo,
    layer_inputs,
    layer_output_grads,
    layer_positions,
    layer_width,
    live_positions,
    output_rows,
    per_sample_gradient,
    sample_chunks,
)
from epochlens.models.layers import check_finite_weights
from epochlens.tasks import Task, Uniforms, per_sample_loss, sample_uniforms

__all__ = [
    "BatchBackprop",
    "Workspace",
    "forward_backprop",
    "prepared_model",
    "resolve_compute_dtype",
    "sample_uniforms",
    "task_batches",
]

MODES = ("loss", "measurement", "empirical", "true", "expected")


def resolve_compute_dtype(model: nn.Module, setting: str) -> torch.dtype:
    """The dtype of forward/backward for ``compute_dtype`` (auto promotes half types to float32)."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    model_dtype = param.dtype if param is not None else torch.float32
    if setting == "model":
        return model_dtype
    if setting == "float32":
        return torch.float32
    if setting == "float64":
        return torch.float64
    return torch.float32 if model_dtype in (torch.float16, torch.bfloat16) else model_dtype


@contextmanager
def prepared_model(
    model: nn.Module, layers: dict[str, LayerInfo], device: torch.device, dtype: torch.dtype
) -> Iterator[nn.Module]:
    """``model`` itself in eval mode on ``device``, floating tensors in ``dtype``, grads on tracked weights.

    Nothing is deep-copied: parameters and buffers that are already on ``device`` in ``dtype`` are used
    as they are; the others are converted for the duration and their original tensors put back on exit
    (exactly, whatever the conversion), as are every module's training flag and every parameter's
    ``requires_grad``. Integer buffers are moved, never cast.

    Raises:
        EpochlensError: NaN/Inf in a weight (named).
    """
    training = [(m, m.training) for m in model.modules()]
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    buffers: list[tuple[nn.Module, str, torch.Tensor]] = []
    try:
        _convert_tensors(model, params, device, dtype, swapped, buffers)
        model.eval()
        model.requires_grad_(False)
        for info in layers.values():
            info.weight.requires_grad_(True)
        check_finite_weights(model)
        yield model
    finally:
        for p, data in swapped:
            p.data = data
        for module, name, b in buffers:
            module._buffers[name] = b
        for p, flag in zip(params, requires, strict=True):
            p.requires_grad_(flag)
        for m, flag in training:
            m.training = flag


def _convert_tensors(
    model: nn.Module,
    params: list[torch.nn.Parameter],
    device: torch.device,
    dtype: torch.dtype,
    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]],
    buffers: list[tuple[nn.Module, str, torch.Tensor]],
) -> None:
    """Put ``params`` and ``model``'s buffers on ``device`` (floating ones in ``dtype``), recording each
    original tensor in ``swapped`` / ``buffers`` as it goes (so a failure midway restores those)."""

    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    for p in params:
        new = convert(p.data)
        if new is not p.data:
            swapped.append((p, p.data))
            p.data = new
    for module in model.modules():
        for name, b in module._buffers.items():
            if b is not None:
                new = convert(b)
                if new is not b:
                    buffers.append((module, name, b))
                    module._buffers[name] = new


@dataclass
class BatchBackprop:
    """One batch's per-sample quantities, kept as the network gave them (compute dtype, module shapes)
    until a layer's are asked for: :meth:`factored` writes one layer's inputs (unfolded patches for a
    convolution, about kh·kw times the layer's input) and output gradients in the dtype asked, and
    :meth:`chunks` does so a chunk of samples at a time, so a caller that works layer by layer never
    holds the whole batch's (for ResNet-18 at 32 images, 1 GiB of float64 patches).

    Attributes:
        layers: layer name -> :class:`LayerInfo`.
        calls: layer name -> the input of each call of the layer (detached, compute dtype).
        output_grads: one dict per backprop vector (one for scores/empirical/true Fisher, one per
            output-Hessian vector for the expected Fisher): layer name -> the gradient of each call's
            output (module-shaped, compute dtype), at the scale of the scaled vector (see ``scales``).
        scales: per backprop vector, (B,) float64 powers of two: the true output gradient is
            ``output_grads / scale``.
        mask: (B, T) bool position mask of the task (padding), a tuple of them (one per token
            dimension, see :meth:`epochlens.tasks.Task.position_mask`), or None.
        positions: layer name -> (B,) float64 positions entering the activation covariance.
        losses: (B,) float64 task loss at the sample's targets (NaN where it has none).
        valid: (B,) bool, False where any of the above is NaN/Inf for that sample.
        vanished: (B,) bool, the loss gradient is non-zero but every tracked gradient vanished in the
            compute dtype (see the module doc).
    """

    layers: dict[str, LayerInfo]
    calls: dict[str, list[torch.Tensor]]
    output_grads: list[dict[str, list[torch.Tensor]]]
    scales: list[torch.Tensor]
    mask: torch.Tensor | tuple[torch.Tensor, ...] | None
    positions: dict[str, torch.Tensor]
    losses: torch.Tensor
    valid: torch.Tensor
    vanished: torch.Tensor

    @property
    def usable(self) -> torch.Tensor:
        """(B,) bool: valid and not vanished."""
        return self.valid & ~self.vanished

    def inputs(self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Layer inputs a (B', T, in_dim) of layer ``name`` in ``dtype``, bias column last, the
        positions of every call concatenated, padding zeroed (see :func:`layer_inputs`)."""
        return self._inputs(name, dtype, _some(rows))

    def output_gradients(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Output gradients ds (B', T, out) of layer ``name`` in ``dtype``, scaled back, per vector."""
        rows = _some(rows)
        return [self._output_gradient(name, dtype, rows, k) for k in range(len(self.output_grads))]

    def factored(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(a (B', T, in_dim), ds (B', T, out)) of layer ``name`` in ``dtype``, per backprop vector."""
        a = self.inputs(name, dtype, rows)
        return [(a, d) for d in self.output_gradients(name, dtype, rows)]

    def gradients(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Per-sample gradient matrices (B', out, in_dim) of layer ``name``, one per backprop vector."""
        return [per_sample_gradient(a, d) for a, d in self.factored(name, dtype, rows)]

    def chunks(
        self,
        name: str,
        dtype: torch.dtype,
        rows: torch.Tensor | None = None,
        copies: int = 1,
        workspace: Workspace | None = None,
    ) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
        """(a, [ds per vector]) of layer ``name`` as :meth:`factored` gives them, for consecutive
        chunks of the rows, each chunk's a and ds, times ``copies`` (2 where the caller forms rotated
        copies of them), at most :func:`epochlens.influence.gradient_math.chunk_bytes` (one sample at
        least).

        With a ``workspace`` the chunks are written into its buffer, valid until the next chunk."""
        info, item = self.layers[name], torch.finfo(dtype).bits // 8
        width = sum(layer_width(info, x) for x in self.calls[name])
        vectors = len(self.output_grads)
        per_sample = copies * width * (info.in_dim + vectors * info.out_dim) * item
        rows = _some(rows)
        index = None if rows is None else rows.nonzero().squeeze(1)
        n = self.valid.shape[0] if index is None else len(index)
        parts = sample_chunks(n, per_sample, device=self.valid.device)
        if len(self.calls[name]) > 1:
            workspace = None  # the calls' positions are concatenated: no room to write them in place
        for part in parts:
            sel = rows if len(parts) == 1 else index[part] if index is not None else part
            b = part.stop - part.start
            bufs = [None] * (1 + vectors)
            if workspace is not None:
                sizes = [b * width * info.in_dim] + [b * width * info.out_dim] * vectors
                bufs = workspace.split(sizes, dtype, self.valid.device)
            a = self._inputs(name, dtype, sel, bufs[0])
            yield a, [self._output_gradient(name, dtype, sel, k, bufs[1 + k]) for k in range(vectors)]

    def _inputs(
        self,
        name: str,
        dtype: torch.dtype,
        rows: torch.Tensor | slice | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        info, mask = self.layers[name], _take(self.mask, rows)
        parts = [layer_inputs(info, _take(x, rows), mask, dtype, out) for x in self.calls[name]]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _output_gradient(
        self,
        name: str,
        dtype: torch.dtype,
        rows: torch.Tensor | slice | None,
        k: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        info, mask, scale = self.layers[name], _take(self.mask, rows), _take(self.scales[k], rows)
        parts = [
            layer_output_grads(info, _take(g, rows), mask, dtype, scale, out)
            for g in self.output_grads[k][name]
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class Workspace:
    """One buffer that a pass writes every chunk of its batches into (:meth:`BatchBackprop.chunks`),
    grown when a chunk needs more. Allocating and freeing chunks of changing sizes batch after batch
    leaves holes in the C allocator's heap, which stay resident: on a CPU that added 150-250 MiB to
    the covariance pass's peak over ResNet-18's ~1.1 GiB."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def split(self, sizes: list[int], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
        """Consecutive 1-D views of the buffer with these numbers of elements."""
        total = sum(sizes)
        buf = self.buffer
        if buf is None or buf.dtype != dtype or buf.device != device or buf.numel() < total:
            self.buffer = buf = None  # the old one goes first
            self.buffer = buf = torch.empty(total, dtype=dtype, device=device)
        return list(buf[:total].split(sizes))


def _take(t: torch.Tensor | tuple | None, rows: torch.Tensor | slice | None) -> torch.Tensor | tuple | None:
    """``t``'s rows ``rows`` (a bool mask, indices, or a slice: a view; None: all, no copy); of
    each tensor of a tuple (a task's masks, one per token dimension)."""
    if isinstance(t, tuple):
        return tuple(_take(m, rows) for m in t)
    return t if rows is None or t is None else t[rows]


def _some(rows: torch.Tensor | None) -> torch.Tensor | None:
    """``rows`` (B,) bool, or None where it selects every row (no copy needed)."""
    return None if rows is None or bool(rows.all()) else rows


def _scales(v: torch.Tensor) -> torch.Tensor:
    """(B,) powers of two bringing each row's largest |entry| into [0.5, 1) (1 for zero/NaN rows)."""
    peak = v.detach().abs().flatten(1).amax(1) if v.ndim > 1 else v.detach().abs()
    ok = torch.isfinite(peak) & (peak > 0)
    _, exponent = torch.frexp(torch.where(ok, peak, torch.ones_like(peak)))
    scale = torch.ldexp(torch.ones_like(peak), -exponent)
    return torch.where(ok, scale, torch.ones_like(peak))


def forward_backprop(
    net: nn.Module,
    capture: ActivationCapture,
    task: Task,
    inputs: Any,
    targets: Any,
    mode: str,
    seed: int,
    sample_indices: np.ndarray,
) -> BatchBackprop:
    """Forward ``inputs`` through ``net`` and back-propagate the vectors of ``mode``.

    Args:
        net: the prepared model (:func:`prepared_model`), with ``capture``'s hooks on it.
        task: the loss.
        inputs, targets: the batch on the compute device (targets may be None for tasks without).
        mode: "loss" (or "empirical"): the loss at the targets; "measurement": the task's query
            measurement; "true": targets drawn from the model; "expected": the output Hessian's vectors.
        seed, sample_indices: the draws of the true Fisher.

    The layers' inputs and output gradients stay in the compute dtype, as the network gave them; the
    autograd graph is freed on return.
    """
    if mode not in MODES:
        raise ValueError(f"unknown backprop mode {mode!r}; one of {MODES}")
    mask = task.position_mask(inputs)
    with torch.enable_grad():
        z = _forward(net, capture, task, inputs)
        zd = z.detach().to(torch.float64)
        losses, vectors = _vectors(task, zd, targets, inputs, mode, seed, sample_indices)
        names = list(capture.layers)
        calls = {n: [x for x, _ in capture.calls[n]] for n in names}
        outputs = [out for n in names for _, out in capture.calls[n]]
        capture.clear()
        valid = torch.isfinite(zd.flatten(1)).all(1) if zd.ndim > 1 else torch.isfinite(zd)
        positions = {}
        for n in names:
            for x in calls[n]:
                valid &= torch.isfinite(x).flatten(1).all(1)  # the patches hold nothing else
            positions[n] = sum(layer_positions(capture.layers[n], x, mask) for x in calls[n])
        grads_per_vector, scales = [], []
        for k, v in enumerate(vectors):
            flat = v.flatten(1) if v.ndim > 1 else v[:, None]
            valid &= torch.isfinite(flat).all(1)
            scale = _scales(v)
            scaled = (v * scale.view(-1, *([1] * (v.ndim - 1)))).to(z.dtype)
            # Σ z·v back-propagates v exactly (no grad_outputs: their first use imports sympy, ~34 MiB)
            grads = torch.autograd.grad(
                (z * scaled).sum(), outputs, retain_graph=k < len(vectors) - 1, allow_unused=True
            )
            grads = [torch.zeros_like(out) if g is None else g for g, out in zip(grads, outputs, strict=True)]
            for g in grads:
                valid &= torch.isfinite(g).flatten(1).all(1)
            grads_per_vector.append(_per_layer(grads, calls))
            scales.append(scale)
    watch = z.dtype != torch.float64  # underflow is possible: find samples no gradient reaches
    del z, outputs, grads  # the graph and the layers' outputs
    vanished = torch.zeros_like(valid)
    if watch:
        vanished = valid & _vanished(capture.layers, calls, grads_per_vector, vectors, mask)
    return BatchBackprop(
        capture.layers, calls, grads_per_vector, scales, mask, positions, losses, valid, vanished
    )


def _forward(net: nn.Module, capture: ActivationCapture, task: Task, inputs: Any) -> torch.Tensor:
    """The task's prediction z with ``capture`` holding every tracked layer's calls (a layer whose
    output a ReLU(inplace=True) modifies is decoupled and the forward redone)."""
    for _ in range(2):
        capture.clear()
        z = task.prediction(task.forward(net, inputs))
        modified = capture.check(z.shape[0])
        if not modified:
            break
        capture.decoupled |= modified  # ReLU(inplace=True) after a tracked layer: copy and redo
    else:  # pragma: no cover - a decoupled layer hands a copy on, which nothing else touches
        raise LayerSelectionError(f"layers {sorted(modified)} keep being modified in place")
    if not z.requires_grad:
        raise LayerSelectionError(
            f"the prediction of task {task.name!r} does not depend on any tracked layer; select "
            "layers that the model's output depends on."
        )
    return z


def _vectors(
    task: Task, zd: torch.Tensor, targets: Any, inputs: Any, mode: str, seed: int, sample_indices: np.ndarray
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(losses (B,) float64 at the targets, the float64 vectors of ``mode`` to back-propagate)."""
    losses = torch.full((zd.shape[0],), torch.nan, dtype=torch.float64, device=zd.device)
    if targets is not None:
        with torch.no_grad():
            losses = per_sample_loss(task, zd, targets, inputs).to(torch.float64)
    if mode == "expected":
        return losses, [v.to(torch.float64) for v in task.fisher_vectors(zd, targets, inputs)]
    tg = targets
    if mode == "true":
        tg = task.sample_targets(zd, targets, inputs, Uniforms(seed, sample_indices, zd.device))
    zg = zd.clone().requires_grad_(True)
    value = per_sample_loss(task, zg, tg, inputs, measurement=mode == "measurement")
    (v,) = torch.autograd.grad(value.sum(), zg, allow_unused=True)
    v = torch.zeros_like(zd) if v is None else v
    if mode == "true":
        weight = task.fisher_weight(zd, targets, inputs)
        if weight is not None:
            v = v * weight.to(v).view(-1, *([1] * (v.ndim - 1)))
    return losses, [v]


def _vanished(
    layers: dict[str, LayerInfo],
    calls: dict[str, list[torch.Tensor]],
    grads_per_vector: list[dict[str, list[torch.Tensor]]],
    vectors: list[torch.Tensor],
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """(B,) bool: a vector is non-zero but no tracked gradient Σ_t ds_t a_tᵀ is (no position t with
    ds_t != 0 and a_t != 0, in any layer, call or vector)."""
    nonzero = torch.zeros(vectors[0].shape[0], dtype=torch.bool, device=vectors[0].device)
    for v in vectors:
        nonzero |= ((v.flatten(1) if v.ndim > 1 else v[:, None]) != 0).any(1)
    reached = torch.zeros_like(nonzero)
    for n, xs in calls.items():
        info = layers[n]
        for k, x in enumerate(xs):
            if bool(reached.all()):
                return nonzero & ~reached
            live = live_positions(info, x, mask)
            for grads in grads_per_vector:
                reached |= ((output_rows(info, grads[n][k]) != 0).any(2) & live).any(1)
    return nonzero & ~reached


def _per_layer(
    grads: list[torch.Tensor], calls: dict[str, list[torch.Tensor]]
) -> dict[str, list[torch.Tensor]]:
    """The flat list of every call's output gradient, in ``calls``' order, grouped by layer."""
    out, i = {}, 0
    for n, xs in calls.items():
        out[n] = grads[i : i + len(xs)]
        i += len(xs)
    return out


def task_batches(
    source: SampleSource,
    task: Task,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Iterator[tuple[np.ndarray, Any, Any]]:
    """(positions (B,) int64, inputs, targets) of the scorable samples of ``source``, on ``device``.

    Floating tensors are cast to ``dtype``, integer ones (token ids, labels, masks) only moved.
    Samples the task cannot score (e.g. a label of an inactive class) are dropped: in-memory sources
    before batching (so batches stay full), datasets batch by batch.
    """
    if source.in_memory and source.rows is None:
        whole = source.inputs if source.targets is None else (source.inputs, source.targets)
        keep = task.scorable(*task.split_batch(whole))
        if keep is not None:
            source = replace(source, rows=np.flatnonzero(keep.cpu().numpy()))
    for positions, batch in source.batches(batch_size):
        inputs, targets = task.split_batch(to_device(batch, device))
        inputs = to_device(inputs, device, dtype)
        targets = to_device(targets, device, torch.float64)  # the loss runs in float64
        if not source.in_memory:
            keep = task.scorable(inputs, targets)
            if keep is not None and not bool(keep.all()):
                rows = keep.to(torch.bool)
                positions = positions[rows.cpu().numpy()]
                inputs, targets = select_rows(inputs, rows), select_rows(targets, rows)
        if len(positions):
            yield positions, inputs, targets
