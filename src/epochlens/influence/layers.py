"""Which modules are tracked, and their per-sample inputs and output gradients.

Tracked modules are ``nn.Linear`` and ``nn.Conv2d``. For one sample, a tracked layer sees inputs
a_t (in_dim,) at positions t = 1..T and the loss gradient of its outputs (pre-activations)
ds_t (out,). Its weight gradient, bias appended as the last column, is

    G = Σ_t ds_t a_tᵀ                     (out, in_dim)

* Linear: T = 1 (or the product of extra leading dimensions), a = [x, 1] if it has a bias.
* Conv2d: the KFC view (Grosse & Martens 2016): a_t is the unfolded input patch under output
  position t, flattened as (C_in, kh, kw), which is the order of ``weight.view(out, -1)``;
  T = H_out·W_out. Padding is zeros, as in the convolution.

Activations are captured by forward hooks; output gradients by ``torch.autograd.grad`` with the
captured outputs as inputs, so no parameter ``.grad`` is touched.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from epochlens.errors import LayerSelectionError

TRACKED_TYPES = (nn.Linear, nn.Conv2d)


@dataclass
class LayerInfo:
    """A tracked module: name in ``model.named_modules()``, kind and gradient shape (out, in_dim)."""

    name: str
    module: nn.Module
    kind: Literal["linear", "conv2d"]
    out_dim: int
    in_features: int  # inputs per position, without the bias column
    has_bias: bool

    @property
    def in_dim(self) -> int:
        """Columns of the layer's gradient matrix: inputs per position plus one for the bias."""
        return self.in_features + int(self.has_bias)

    @property
    def num_params(self) -> int:
        return self.out_dim * self.in_dim


def select_layers(
    model: nn.Module, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()
) -> dict[str, LayerInfo]:
    """Tracked layers of ``model`` in module order, chosen by fnmatch patterns on their names.

    Args:
        model: the network.
        include: patterns (``"fc"``, ``"layer4.*"``); empty: every Linear and Conv2d.
        exclude: patterns removed from the selection.

    Raises:
        LayerSelectionError: a pattern matching no trackable module, an empty selection, or a
            selected Conv2d that the unfold view cannot represent (groups > 1, non-zero padding mode).
    """
    candidates = {n: m for n, m in model.named_modules() if isinstance(m, TRACKED_TYPES)}
    if not candidates:
        raise LayerSelectionError(
            f"{type(model).__name__} has no nn.Linear or nn.Conv2d module to track; influence "
            "needs at least one."
        )
    for pattern in include:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in candidates):
            raise LayerSelectionError(
                f"layer pattern {pattern!r} matches no Linear/Conv2d module; trackable modules are "
                f"{_short(list(candidates))}. Fix influence layers in the config."
            )
    chosen = {}
    for name, module in candidates.items():
        if include and not any(fnmatch.fnmatchcase(name, p) for p in include):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in exclude):
            continue
        chosen[name] = _describe(name, module)
    if not chosen:
        raise LayerSelectionError(
            f"the layer selection (include {list(include)}, exclude {list(exclude)}) leaves no layer "
            f"of {_short(list(candidates))}; widen it."
        )
    return chosen


def _describe(name: str, module: nn.Module) -> LayerInfo:
    has_bias = getattr(module, "bias", None) is not None
    if isinstance(module, nn.Linear):
        return LayerInfo(name, module, "linear", module.out_features, module.in_features, has_bias)
    if module.groups != 1:
        raise LayerSelectionError(
            f"layer {name!r}: Conv2d with groups={module.groups} is not supported by the KFC factors; "
            "exclude it with influence exclude_layers."
        )
    if module.padding_mode != "zeros":
        raise LayerSelectionError(
            f"layer {name!r}: Conv2d padding_mode={module.padding_mode!r} is not supported (only "
            "zeros); exclude it with influence exclude_layers."
        )
    kh, kw = module.kernel_size
    return LayerInfo(name, module, "conv2d", module.out_channels, module.in_channels * kh * kw, has_bias)


def _short(names: list[str], n: int = 12) -> str:
    return str(names) if len(names) <= n else f"{names[:n]} and {len(names) - n} more"


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


def layer_inputs(info: LayerInfo, x: torch.Tensor) -> torch.Tensor:
    """Per-position inputs (B, T, in_dim) of a layer given its input ``x``, bias column last."""
    m = info.module
    if info.kind == "conv2d":
        # Patches as a strided view, copied once: F.unfold's parallel im2col is up to 1000x slower
        # for small images on a CPU whose cores are busy with other work.
        x = F.pad(x, _conv_padding(m))
        (kh, kw), (sh, sw), (dh, dw) = m.kernel_size, m.stride, m.dilation
        p = x.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)  # (B, C, Ho, Wo, ., .)
        p = p[..., ::dh, ::dw]  # (B, C, Ho, Wo, kh, kw)
        a = p.permute(0, 2, 3, 1, 4, 5).reshape(x.shape[0], p.shape[2] * p.shape[3], -1)
    else:
        a = x.reshape(x.shape[0], -1, x.shape[-1])
    if info.has_bias:
        a = torch.cat([a, a.new_ones(a.shape[0], a.shape[1], 1)], dim=2)
    return a


def layer_output_grads(info: LayerInfo, ds: torch.Tensor) -> torch.Tensor:
    """Output gradients as (B, T, out) from the module's output-shaped gradient."""
    if info.kind == "conv2d":
        return ds.flatten(2).transpose(1, 2)
    return ds.reshape(ds.shape[0], -1, ds.shape[-1])


def per_sample_gradient(a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
    """G_n = Σ_t ds_{n,t} a_{n,t}ᵀ: (B, out, in_dim) from a (B, T, in_dim) and ds (B, T, out)."""
    if a.shape[1] == 1:
        return ds[:, 0, :, None] * a[:, 0, None, :]
    return torch.einsum("bto,bti->boi", ds, a)


def rotated_gradient(a: torch.Tensor, ds: torch.Tensor, qs: torch.Tensor, qa: torch.Tensor) -> torch.Tensor:
    """Q_Sᵀ G_n Q_A (B, out, in_dim) for G_n = Σ_t ds_t a_tᵀ, without forming G_n where cheaper.

    Σ_t (Q_Sᵀ ds_t)(Q_Aᵀ a_t)ᵀ costs T(in² + out² + out·in) per sample against T·out·in + out²·in +
    out·in² for rotating G_n: 30x less for ResNet-18's layer4 (T = 16, in = 4609, out = 512).
    a: (B, T, in_dim), ds: (B, T, out), qs: (out, out), qa: (in_dim, in_dim), all one dtype.
    """
    t, n_out, n_in = a.shape[1], qs.shape[0], qa.shape[0]
    if t * (n_in * n_in + n_out * n_out + n_out * n_in) < t * n_out * n_in + n_out * n_in * (n_out + n_in):
        return per_sample_gradient(a @ qa, ds @ qs)
    return qs.T @ per_sample_gradient(a, ds) @ qa


def gradient_to_parameters(info: LayerInfo, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Split gradient matrices (..., out, in_dim) into the module's ``weight`` and ``bias`` shapes."""
    lead = g.shape[:-2]
    weight = g[..., : info.in_features].reshape(*lead, *info.module.weight.shape)
    out = {"weight": weight}
    if info.has_bias:
        out["bias"] = g[..., info.in_features]
    return out


class ActivationCapture:
    """Forward hooks recording each tracked layer's input (detached) and output, one forward at a time.

    Use as a context manager around forwards; :meth:`check` after a forward verifies that every
    tracked layer ran exactly once and that no output was modified in place afterwards (whose
    gradient would then be that of another tensor).
    """

    def __init__(self, layers: dict[str, LayerInfo]) -> None:
        self.layers = layers
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self._versions: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        self._handles: list = []

    def __enter__(self) -> ActivationCapture:
        for name, info in self.layers.items():
            self._handles.append(info.module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.clear()

    def _hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            self._calls[name] = self._calls.get(name, 0) + 1
            self.inputs[name] = args[0].detach()
            self.outputs[name] = output
            self._versions[name] = output._version

        return hook

    def clear(self) -> None:
        self.inputs.clear()
        self.outputs.clear()
        self._versions.clear()
        self._calls.clear()

    def check(self) -> None:
        for name in self.layers:
            calls = self._calls.get(name, 0)
            if calls != 1:
                what = "never ran" if calls == 0 else f"ran {calls} times (a shared module)"
                raise LayerSelectionError(
                    f"layer {name!r} {what} in one forward pass; per-sample gradients need each "
                    "tracked layer to run once. Exclude it with influence exclude_layers."
                )
            if self.outputs[name]._version != self._versions[name]:
                raise LayerSelectionError(
                    f"layer {name!r}: its output is modified in place by the next operation (e.g. "
                    "ReLU(inplace=True) directly after it), so its gradient cannot be read. Use "
                    "inplace=False there, or exclude the layer."
                )
            if not self.outputs[name].requires_grad:
                raise LayerSelectionError(
                    f"layer {name!r}: its output does not require grad (is it under torch.no_grad()?)."
                )
