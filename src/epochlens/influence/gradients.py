"""Per-sample layer inputs and output gradients of a batch, for the curvature and for the scores.

Loss: the per-sample cross-entropy ℓ(z, y) over the logits z of the active classes only
(:func:`epochlens.models.networks.restrict_logits`), the target being y's position among them, model in
eval mode (samples do not interact, so each row of a batched backward is that sample's own).
Its gradient with respect to z is p − e_y, p = softmax(z); back-propagating a vector v (B, A)
from z gives every tracked layer's output gradient ds for "label distribution" v:

* scores and the empirical Fisher: v = p − e_y (y the sample's label);
* true Fisher: v = p − e_ŷ, ŷ drawn from p with a uniform that is a pure function of
  (seed, sample index) (SplitMix64), so the draw does not depend on batching;
* expected Fisher: one vector per active class c, v_c = √p_c (p − e_c), so that
  Σ_c ds_c ds_cᵀ = E_{y~p}[ds dsᵀ] and the factors reproduce the GGN Jᵀ(diag p − p pᵀ)J.

A sample whose probabilities, tracked inputs or output gradients hold NaN/Inf is marked invalid
(its rows are never mixed into another sample's numbers); callers leave it out and report it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from epochlens.influence.layers import (
    ActivationCapture,
    LayerInfo,
    layer_inputs,
    layer_output_grads,
    per_sample_gradient,
)
from epochlens.models.networks import restrict_logits

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_LABEL_STREAM = np.uint64(0x1F1F1F1F)  # separates this use of the seed from others


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def sample_uniforms(seed: int, sample_indices: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1), one per sample, a pure function of (seed, global sample index): (B,)."""
    idx = np.asarray(sample_indices).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed % 2**64], dtype=np.uint64) ^ _LABEL_STREAM)
        words = _mix64(_mix64(idx ^ key) + _GAMMA)
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


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


def prepare_model(model: nn.Module, layers: dict[str, LayerInfo], device: torch.device, dtype: torch.dtype):
    """A copy of ``model`` in eval mode on ``device``/``dtype``, gradients only on tracked layers.

    Returns:
        (net, layers) with ``layers`` rebound to the copy's modules.
    """
    net = copy.deepcopy(model).to(device=device, dtype=dtype).eval().requires_grad_(False)
    modules = dict(net.named_modules())
    rebound = {}
    for name, info in layers.items():
        module = modules[name]
        module.weight.requires_grad_(True)
        rebound[name] = LayerInfo(name, module, info.kind, info.out_dim, info.in_features, info.has_bias)
    return net, rebound


@dataclass
class BatchBackprop:
    """One batch's per-sample quantities.

    Attributes:
        inputs: layer name -> (B, T, in_dim) layer inputs, bias column last (compute dtype).
        output_grads: one dict per backprop vector (one for scores/empirical/true Fisher, one per
            active class for the expected Fisher): layer name -> (B, T, out).
        probs: (B, A) float64 predicted probabilities over the active classes.
        losses: (B,) float64 cross-entropy at the sample's label (NaN where the label is unknown).
        valid: (B,) bool, False where any of the above is NaN/Inf for that sample.
    """

    inputs: dict[str, torch.Tensor]
    output_grads: list[dict[str, torch.Tensor]]
    probs: torch.Tensor
    losses: torch.Tensor
    valid: torch.Tensor

    def factored(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(a (B', T, in_dim), ds (B', T, out)) of layer ``name`` in ``dtype``, per backprop vector."""
        a = self.inputs[name] if rows is None else self.inputs[name][rows]
        a = a.to(dtype)
        return [(a, (ds[name] if rows is None else ds[name][rows]).to(dtype)) for ds in self.output_grads]

    def gradients(
        self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Per-sample gradient matrices (B', out, in_dim) of layer ``name``, one per backprop vector."""
        a = self.inputs[name] if rows is None else self.inputs[name][rows]
        a = a.to(dtype)
        out = []
        for ds in self.output_grads:
            d = ds[name] if rows is None else ds[name][rows]
            out.append(per_sample_gradient(a, d.to(dtype)))
        return out


def backprop_vectors(
    probs: torch.Tensor, targets: torch.Tensor, fisher: str, seed: int, sample_indices: np.ndarray
) -> list[torch.Tensor]:
    """Vectors (B, A) float64 to back-propagate from the restricted logits (see module doc).

    ``fisher`` is "empirical" (also used for scores: the sample's own label), "true" or "expected".
    Rows with NaN probabilities get zero vectors (the sample is invalid anyway).
    """
    p = torch.nan_to_num(probs, nan=0.0)
    n, n_classes = p.shape
    if fisher == "expected":
        eye = torch.eye(n_classes, dtype=p.dtype, device=p.device)
        return [p.clamp_min(0).sqrt()[:, c : c + 1] * (p - eye[c]) for c in range(n_classes)]
    if fisher == "true":
        u = torch.as_tensor(sample_uniforms(seed, sample_indices), dtype=p.dtype, device=p.device)
        cdf = p.cumsum(1)
        labels = (cdf < u[:, None] * cdf[:, -1:]).sum(1).clamp_max(n_classes - 1)
    elif fisher == "empirical":
        labels = targets.clamp_min(0)
    else:
        raise ValueError(f"unknown fisher type {fisher!r}")
    v = p.clone()
    v[torch.arange(n, device=p.device), labels] -= 1.0
    return [v]


def forward_backprop(
    net: nn.Module,
    capture: ActivationCapture,
    x: torch.Tensor,
    targets: torch.Tensor,
    active_idx: torch.Tensor,
    fisher: str,
    seed: int,
    sample_indices: np.ndarray,
) -> BatchBackprop:
    """Forward ``x`` (B, ...) through ``net`` and back-propagate the vectors of ``fisher``.

    ``targets`` (B,) are positions of the labels among the active classes (-1: unknown label,
    allowed only for the true and expected Fisher).
    """
    capture.clear()
    with torch.enable_grad():
        z = restrict_logits(net(x), active_idx)
        capture.check()
        probs = torch.softmax(z.detach().to(torch.float64), dim=1)
        logp = torch.log_softmax(z.detach().to(torch.float64), dim=1)
        rows = torch.arange(len(x), device=x.device)
        losses = torch.where(targets >= 0, -logp[rows, targets.clamp_min(0)], torch.nan)
        vectors = backprop_vectors(probs, targets, fisher, seed, sample_indices)
        names = list(capture.layers)
        outputs = [capture.outputs[n] for n in names]
        inputs = {n: layer_inputs(capture.layers[n], capture.inputs[n]) for n in names}
        grads_per_vector = []
        for k, v in enumerate(vectors):
            grads = torch.autograd.grad(
                z, outputs, grad_outputs=v.to(z.dtype), retain_graph=k < len(vectors) - 1, allow_unused=True
            )
            ds = {}
            for n, out, g in zip(names, outputs, grads, strict=True):
                g = torch.zeros_like(out) if g is None else g
                ds[n] = layer_output_grads(capture.layers[n], g)
            grads_per_vector.append(ds)
    capture.clear()
    valid = torch.isfinite(probs).all(1)
    for n in names:
        valid &= torch.isfinite(inputs[n]).flatten(1).all(1)
        for ds in grads_per_vector:
            valid &= torch.isfinite(ds[n]).flatten(1).all(1)
    return BatchBackprop(inputs, grads_per_vector, probs, losses, valid)
