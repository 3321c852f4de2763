"""Which modules are tracked, and their per-sample inputs and output gradients.

Tracked modules are ``nn.Linear``, ``nn.Conv2d`` and GPT-2's ``transformers.pytorch_utils.Conv1D`` (a
Linear whose weight is stored transposed, (in, out)). For one sample, a tracked layer sees inputs
a_t (in_dim,) at positions t = 1..T and the loss gradient of its outputs (pre-activations)
ds_t (out,). Its weight gradient, bias appended as the last column, is

    G = Σ_t ds_t a_tᵀ                     (out, in_dim)

* Linear / Conv1D: T = 1 for inputs (B, d), T = the token dimension for (B, T, d) (or the product of
  extra dimensions), a = [x, 1] if it has a bias. A task's position mask (B, T) (padding) zeroes the
  positions that are not real tokens, in a and ds, so they enter no covariance and no gradient.
* Conv2d: the KFC view (Grosse & Martens 2016): a_t is the unfolded input patch under output
  position t, flattened as (C_in, kh, kw), which is the order of ``weight.view(out, -1)``;
  T = H_out·W_out. Padding is zeros, as in the convolution.
* A module called several times in one forward (recurrence), or several modules sharing one weight
  (weight tying), form one layer whose positions are those of every call, concatenated: the weight's
  gradient is the sum over calls, Σ_calls Σ_t ds_t a_tᵀ, and the covariances sum over calls (as
  kronfluence does with ``has_shared_parameters``).

Activations are captured by forward hooks; output gradients by ``torch.autograd.grad`` with the
captured outputs as inputs, so no parameter ``.grad`` is touched. An output modified in place by the
next operation (``ReLU(inplace=True)``) is detected after the forward; the hook then hands a copy to
the rest of the network and keeps the original, whose gradient is the pre-activation gradient.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from epochlens.errors import LayerSelectionError
from epochlens.influence.gradient_math import (  # noqa: F401 (re-exported: layers.CHUNK_BYTES, ...)
    CHUNK_BYTES,
    GRAM_BLOCK,
    _rotate_first,
    chunk_bytes,
    gradient_chunks,
    gram_,
    held_in_eigenbasis,
    per_sample_gradient,
    rotated_gradient,
    sample_chunks,
    symmetrize_,
)

TRACKED_TYPES = (nn.Linear, nn.Conv2d)
SUPPORTED = "nn.Linear, nn.Conv2d (groups=1, zero padding) and transformers' Conv1D (GPT-2)"


def _conv1d_type() -> type | None:
    """transformers' Conv1D if transformers is loaded (a model that holds one has imported it)."""
    module = sys.modules.get("transformers.pytorch_utils")
    return getattr(module, "Conv1D", None)


def trackable(module: nn.Module) -> bool:
    """Whether influence can track ``module`` (see :data:`SUPPORTED`)."""
    conv1d = _conv1d_type()
    return isinstance(module, TRACKED_TYPES) or (conv1d is not None and isinstance(module, conv1d))


@dataclass
class LayerInfo:
    """A tracked layer: name in ``model.named_modules()``, kind and gradient shape (out, in_dim).

    Attributes:
        aliases: other modules sharing this layer's weight (weight tying), tracked as one layer.
        extra_modules: those modules.
        note: e.g. a weight shared with a module that is not tracked.
    """

    name: str
    module: nn.Module
    kind: Literal["linear", "conv2d", "conv1d"]
    out_dim: int
    in_features: int  # inputs per position, without the bias column
    has_bias: bool
    aliases: tuple[str, ...] = ()
    extra_modules: tuple[nn.Module, ...] = field(default=(), repr=False)
    note: str = ""

    @property
    def in_dim(self) -> int:
        """Columns of the layer's gradient matrix: inputs per position plus one for the bias."""
        return self.in_features + int(self.has_bias)

    @property
    def num_params(self) -> int:
        return self.out_dim * self.in_dim

    @property
    def modules(self) -> tuple[nn.Module, ...]:
        return (self.module, *self.extra_modules)

    @property
    def weight(self) -> torch.Tensor:
        return self.module.weight


def _conv_padding(module: nn.Conv2d) -> tuple[int, int, int, int]:
    """(left, right, top, bottom) zero padding of a convolution, for ``F.pad``."""
    if isinstance(module.padding, str):
        if module.padding == "valid":
            return (0, 0, 0, 0)
        pads = []  # "same": stride 1, total = dilation * (k - 1), extra on the right/bottom
        for d, k in zip(reversed(module.dilation), reversed(module.kernel_size), strict=True):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return tuple(pads)  # type: ignore[return-value]
    ph, pw = module.padding
    return (pw, pw, ph, ph)


def _token_mask(x: torch.Tensor, mask: torch.Tensor | tuple[torch.Tensor, ...] | None) -> torch.Tensor | None:
    """The (B, T) mask if ``x`` is (B, T, d) with the mask's T positions, else None (no token dimension).

    A tuple of masks (an encoder-decoder's: one per token dimension, of different lengths) gives
    the one whose T is ``x``'s."""
    masks = mask if isinstance(mask, tuple) else (mask,)
    for m in masks:
        if m is not None and x.ndim == 3 and tuple(x.shape[:2]) == tuple(m.shape):
            return m
    return None


def _patches(m: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The input patches of a convolution as a strided view (B, Ho, Wo, C, kh, kw) of padded ``x``.

    Copied once by the caller: F.unfold's parallel im2col is up to 1000x slower for small images on a
    CPU whose cores are busy with other work.
    """
    x = F.pad(x, _conv_padding(m))
    (kh, kw), (sh, sw), (dh, dw) = m.kernel_size, m.stride, m.dilation
    p = x.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)  # (B, C, Ho, Wo, ., .)
    return p[..., ::dh, ::dw].permute(0, 2, 3, 1, 4, 5)


def layer_inputs(
    info: LayerInfo,
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-position inputs (B, T, in_dim) of a layer given its input ``x``, bias column last, in
    ``dtype`` (default ``x``'s), contiguous; written into ``out`` (B·T·in_dim numbers, contiguous)
    if given.

    ``mask`` (B, T) bool zeroes the positions that are not real tokens when ``x`` is (B, T, d). The
    patches (or rows), the cast and the bias column are written into the result in one copy: for a
    ResNet's convolutions this tensor is the largest of a batch, and each extra copy costs as much
    as a convolution.
    """
    dtype = dtype or x.dtype
    token = None
    if info.kind == "conv2d":
        rows = _patches(info.module, x)
        b, t, d = x.shape[0], rows.shape[1] * rows.shape[2], info.in_features
    else:
        token = _token_mask(x, mask)
        rows = x.reshape(x.shape[0], -1, x.shape[-1])
        b, t, d = rows.shape
    if out is None and not info.has_bias and rows.dtype == dtype:  # may be a view of x: never written to
        a = rows.reshape(b, t, d)
        return a.contiguous() if token is None else a * token[:, :, None].to(a.dtype)
    shape = (b, t, d + info.has_bias)
    a = torch.empty(shape, dtype=dtype, device=x.device) if out is None else out.view(shape)
    a[..., :d].view(rows.shape).copy_(rows)
    if info.has_bias:
        a[..., d] = 1
    if token is not None:
        a *= token[:, :, None].to(a.dtype)
    return a


def layer_output_grads(
    info: LayerInfo,
    ds: torch.Tensor,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Output gradients as (B, T, out), contiguous, in ``dtype`` (default ``ds``'s), from the module's
    output-shaped gradient, masked as the inputs, divided by ``scale`` (B,) if given (one pass);
    written into ``out`` (B·T·out numbers, contiguous) if given."""
    token = None if info.kind == "conv2d" else _token_mask(ds, mask)
    rows = output_rows(info, ds)
    dtype = dtype or ds.dtype
    out = torch.empty(rows.shape, dtype=dtype, device=ds.device) if out is None else out.view(rows.shape)
    if scale is None:
        out.copy_(rows)
    elif torch.promote_types(rows.dtype, out.dtype) == out.dtype:
        torch.div(rows, scale.to(out.dtype)[:, None, None], out=out)
    else:
        out.copy_(rows / scale.to(rows.dtype)[:, None, None])
    if token is not None:
        out *= token[:, :, None].to(out.dtype)
    return out


def output_rows(info: LayerInfo, ds: torch.Tensor) -> torch.Tensor:
    """The module-shaped output gradient ``ds`` as (B, T, out), a view (unmasked, unscaled)."""
    if info.kind == "conv2d":
        return ds.flatten(2).transpose(1, 2)
    return ds.reshape(ds.shape[0], -1, ds.shape[-1])


def live_positions(info: LayerInfo, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) bool: the positions whose input a_t (:func:`layer_inputs`) is non-zero, from the
    layer's input ``x`` without unfolding it. A bias column is 1 at every real position."""
    if info.kind == "conv2d":
        if info.has_bias:
            return torch.ones(x.shape[0], _conv_positions(info.module, x), dtype=torch.bool, device=x.device)
        nonzero = (x != 0).any(1, keepdim=True).to(torch.uint8)  # (B, 1, H, W): a patch's columns
        p = _patches(info.module, nonzero)
        return p.reshape(p.shape[0], p.shape[1] * p.shape[2], -1).any(2).to(torch.bool)
    token = _token_mask(x, mask)
    rows = x.reshape(x.shape[0], -1, x.shape[-1])
    live = (
        torch.ones(rows.shape[:2], dtype=torch.bool, device=x.device) if info.has_bias else (rows != 0).any(2)
    )
    return live if token is None else live & token.to(torch.bool)


def _conv_positions(m: nn.Conv2d, x: torch.Tensor) -> int:
    """Ho·Wo of a convolution's output for input ``x``."""
    (kh, kw), (sh, sw), (dh, dw) = m.kernel_size, m.stride, m.dilation
    left, right, top, bottom = _conv_padding(m)
    ho = (x.shape[2] + top + bottom - (kh - 1) * dh - 1) // sh + 1
    wo = (x.shape[3] + left + right - (kw - 1) * dw - 1) // sw + 1
    return ho * wo


def layer_width(info: LayerInfo, x: torch.Tensor) -> int:
    """T: the positions per sample of one call of the layer with input ``x`` (padding included)."""
    if info.kind == "conv2d":
        return _conv_positions(info.module, x)
    return x[0].numel() // x.shape[-1] if x.shape[0] else 0


def layer_positions(info: LayerInfo, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Positions per sample (B,) float64 that enter the activation covariance (real tokens only)."""
    token = None if info.kind == "conv2d" else _token_mask(x, mask)
    if token is not None:
        return token.sum(1).to(torch.float64)
    return torch.full((x.shape[0],), float(layer_width(info, x)), dtype=torch.float64, device=x.device)


def gradient_to_parameters(info: LayerInfo, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Split gradient matrices (..., out, in_dim) into the module's ``weight`` and ``bias`` shapes."""
    lead = g.shape[:-2]
    w = g[..., : info.in_features]
    if info.kind == "conv1d":  # weight stored (in, out)
        weight = w.transpose(-1, -2).reshape(*lead, *info.module.weight.shape)
    else:
        weight = w.reshape(*lead, *info.module.weight.shape)
    out = {"weight": weight}
    if info.has_bias:
        out["bias"] = g[..., info.in_features]
    return out


class ActivationCapture:
    """Forward hooks recording every call of each tracked layer: its input (detached) and output.

    Use as a context manager around forwards; :meth:`check` after a forward verifies that every
    tracked layer ran, with the samples along the first dimension, and returns the layers whose
    output (or input) was modified in place after the call (``ReLU(inplace=True)``): their hooks then
    hand a copy to the network and keep the original (set :attr:`decoupled`; the forward is redone).

    Attributes:
        calls: layer name -> [(input (detached), output), ...] in call order.
        decoupled: layers whose hooks copy (see above).
    """

    def __init__(self, layers: dict[str, LayerInfo]) -> None:
        self.layers = layers
        self.calls: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._versions: dict[str, list[tuple[int, int]]] = {}
        self.decoupled: set[str] = set()
        self._handles: list = []

    def __enter__(self) -> ActivationCapture:
        for name, info in self.layers.items():
            for module in info.modules:
                self._handles.append(module.register_forward_hook(self._hook(name), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.clear()

    def _hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor | None:
            x = args[0] if args else next(iter(kwargs.values()), None)
            if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise LayerSelectionError(
                    f"layer {name!r}: its input or output is not a tensor; exclude it with influence "
                    "exclude_layers."
                )
            if name in self.decoupled:
                self.calls.setdefault(name, []).append((x.detach().clone(), output))
                self._versions.setdefault(name, []).append((-1, -1))
                return output.clone()
            self.calls.setdefault(name, []).append((x.detach(), output))
            self._versions.setdefault(name, []).append((x._version, output._version))
            return None

        return hook

    def clear(self) -> None:
        self.calls.clear()
        self._versions.clear()

    def check(self, batch_size: int) -> set[str]:
        """Raise for layers that cannot be read; return those modified in place (to decouple)."""
        modified = set()
        for name in self.layers:
            calls = self.calls.get(name, [])
            if not calls:
                raise LayerSelectionError(
                    f"layer {name!r} never ran in the forward pass (the model calls its weight through "
                    "another path, e.g. F.linear); exclude it with influence exclude_layers."
                )
            for (x, out), (vx, vo) in zip(calls, self._versions[name], strict=True):
                if x.shape[0] != batch_size or out.shape[0] != batch_size:
                    raise LayerSelectionError(
                        f"layer {name!r} received {x.shape[0]} rows for a batch of {batch_size} samples "
                        "(the model reshapes samples together, e.g. to (batch x tokens, features)); "
                        "per-sample gradients need the samples along the first dimension. Exclude it."
                    )
                if not out.requires_grad:
                    raise LayerSelectionError(
                        f"layer {name!r}: its output does not require grad (is it under torch.no_grad()?)."
                    )
                if vo >= 0 and (out._version != vo or x._version != vx):
                    modified.add(name)
        return modified
