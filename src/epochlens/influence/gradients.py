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
    per_sample_gradient,
)
from epochlens.models.layers import check_finite_weights
from epochlens.tasks import Task, Uniforms, per_sample_loss, sample_uniforms

__all__ = [
    "BatchBackprop",
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

    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    try:
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


@dataclass
class BatchBackprop:
    """One batch's per-sample quantities.

    Attributes:
        inputs: layer name -> (B, T, in_dim) layer inputs, bias column last (the stored dtype: see
            :func:`forward_backprop`), the positions of every call concatenated, padding zeroed.
        output_grads: one dict per backprop vector (one for scores/empirical/true Fisher, one per
            output-Hessian vector for the expected Fisher): layer name -> (B, T, out), stored dtype,
            at the scale of the scaled vector (see ``scales``).
        scales: per backprop vector, (B,) float64 powers of two: the true output gradient is
            ``output_grads / scale``; None where the gradients are stored divided already.
        positions: layer name -> (B,) float64 positions entering the activation covariance.
        losses: (B,) float64 task loss at the sample's targets (NaN where it has none).
        valid: (B,) bool, False where any of the above is NaN/Inf for that sample.
        vanished: (B,) bool, the loss gradient is non-zero but every tracked gradient vanished in the
            compute dtype (see the module doc).
    """

    inputs: dict[str, torch.Tensor]
    output_grads: list[dict[str, torch.Tensor]]
    scales: list[torch.Tensor]
    positions: dict[str, torch.Tensor]
    losses: torch.Tensor
    valid: torch.Tensor
    vanished: torch.Tensor

    @property
    def usable(self) -> torch.Tensor:
        """(B,) bool: valid and not vanished."""
        return self.valid & ~self.vanished

    def factored(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(a (B', T, in_dim), ds (B', T, out)) of layer ``name`` in ``dtype``, per backprop vector."""
        rows = _some(rows)
        a = self.inputs[name] if rows is None else self.inputs[name][rows]
        return [(a.to(dtype), d) for d in self.output_gradients(name, dtype, rows)]

    def output_gradients(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Output gradients ds (B', T, out) of layer ``name`` in ``dtype``, scaled back, per vector."""
        rows, out = _some(rows), []
        for ds, scale in zip(self.output_grads, self.scales, strict=True):
            d = ds[name] if rows is None else ds[name][rows]
            if scale is None:
                out.append(d.to(dtype))
                continue
            s = scale if rows is None else scale[rows]
            out.append(d.to(dtype) * (1.0 / s).to(dtype)[:, None, None])
        return out

    def gradients(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Per-sample gradient matrices (B', out, in_dim) of layer ``name``, one per backprop vector."""
        return [per_sample_gradient(a, d) for a, d in self.factored(name, dtype, rows)]


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
    dtype: torch.dtype | None = None,
) -> BatchBackprop:
    """Forward ``inputs`` through ``net`` and back-propagate the vectors of ``mode``.

    Args:
        net: the prepared model (:func:`prepared_model`), with ``capture``'s hooks on it.
        task: the loss.
        inputs, targets: the batch on the compute device (targets may be None for tasks without).
        mode: "loss" (or "empirical"): the loss at the targets; "measurement": the task's query
            measurement; "true": targets drawn from the model; "expected": the output Hessian's vectors.
        seed, sample_indices: the draws of the true Fisher.
        dtype: the dtype the layer inputs and output gradients are stored in, the output gradients
            divided by their scales already (exact: powers of two), e.g. the float64 of the factors,
            written in one copy each; None: the compute dtype, gradients at their scale (``scales``).
    """
    if mode not in MODES:
        raise ValueError(f"unknown backprop mode {mode!r}; one of {MODES}")
    mask = task.position_mask(inputs)
    with torch.enable_grad():
        for _ in range(2):
            capture.clear()
            z = task.prediction(task.forward(net, inputs))
            b = z.shape[0]
            modified = capture.check(b)
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
        zd = z.detach().to(torch.float64)
        losses = torch.full((b,), torch.nan, dtype=torch.float64, device=z.device)
        if targets is not None:
            with torch.no_grad():
                losses = per_sample_loss(task, zd, targets, inputs).to(torch.float64)
        if mode == "expected":
            vectors = [v.to(torch.float64) for v in task.fisher_vectors(zd, targets, inputs)]
        else:
            tg = targets
            if mode == "true":
                tg = task.sample_targets(zd, targets, inputs, Uniforms(seed, sample_indices, z.device))
            zg = zd.clone().requires_grad_(True)
            value = per_sample_loss(task, zg, tg, inputs, measurement=mode == "measurement")
            (v,) = torch.autograd.grad(value.sum(), zg, allow_unused=True)
            v = torch.zeros_like(zd) if v is None else v
            if mode == "true":
                weight = task.fisher_weight(zd, targets, inputs)
                if weight is not None:
                    v = v * weight.to(v).view(-1, *([1] * (v.ndim - 1)))
            vectors = [v]
        names = list(capture.layers)
        outputs = [out for n in names for _, out in capture.calls[n]]
        watch = z.dtype != torch.float64  # underflow is possible: find samples no gradient reaches
        valid = torch.isfinite(zd.flatten(1)).all(1) if zd.ndim > 1 else torch.isfinite(zd)
        inputs_by_layer, positions, live = {}, {}, {}
        for n in names:
            info = capture.layers[n]
            calls = capture.calls[n]
            parts = []
            for x, _ in calls:
                valid &= torch.isfinite(x).flatten(1).all(1)  # the patches hold nothing else
                parts.append(layer_inputs(info, x, mask, dtype))
            inputs_by_layer[n] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            positions[n] = sum(layer_positions(info, x, mask) for x, _ in calls)
            if watch:
                live[n] = _live_positions(info, inputs_by_layer[n])
        grads_per_vector, scales = [], []
        nonzero = torch.zeros(b, dtype=torch.bool, device=z.device)
        reached = torch.zeros(b, dtype=torch.bool, device=z.device)
        for k, v in enumerate(vectors):
            flat = v.flatten(1) if v.ndim > 1 else v[:, None]
            valid &= torch.isfinite(flat).all(1)
            nonzero |= (flat != 0).any(1)
            scale = _scales(v)
            scaled = (v * scale.view(-1, *([1] * (v.ndim - 1)))).to(z.dtype)
            grads = torch.autograd.grad(
                z, outputs, grad_outputs=scaled, retain_graph=k < len(vectors) - 1, allow_unused=True
            )
            ds, i = {}, 0
            for n in names:
                info = capture.layers[n]
                parts = []
                for _, out in capture.calls[n]:
                    g = torch.zeros_like(out) if grads[i] is None else grads[i]
                    i += 1
                    valid &= torch.isfinite(g).flatten(1).all(1)
                    parts.append(layer_output_grads(info, g, mask, dtype, None if dtype is None else scale))
                ds[n] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                if watch and not bool(reached.all()):
                    reached |= ((ds[n] != 0).any(2) & live[n]).any(1)  # some ds_t a_tᵀ is non-zero
            grads_per_vector.append(ds)
            scales.append(scale if dtype is None else None)
    capture.clear()
    vanished = valid & nonzero & ~reached if watch else torch.zeros_like(valid)
    return BatchBackprop(inputs_by_layer, grads_per_vector, scales, positions, losses, valid, vanished)


def _live_positions(info: LayerInfo, a: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: positions whose input a_t is non-zero (a bias column is 1 at every real position)."""
    return a[..., -1] != 0 if info.has_bias else (a != 0).any(2)


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
