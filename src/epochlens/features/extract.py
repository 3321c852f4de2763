"""Per-layer features of a checkpoint, batch by batch, through forward hooks.

Which layers: a *layer spec* is ``None`` (the default: every block output of the architecture, see
:func:`epochlens.models.layers.default_layers`) or a list of module names as in
``model.named_modules()`` (``"block2"``, ``"layer3.1"``, ``"layer3.1.conv2"``, ``"fc"``). A forward
hook on each module turns its output (B, C, H, W) or (B, D) into the representations of
:mod:`epochlens.features.representations` as soon as the module has run, so only one batch of
activations is ever held and later in-place operations (ReLU) cannot alter what is recorded. The
model runs in eval mode without gradients, on a copy, in float32 or, where asked (``precision``),
autocast to bfloat16 / float16 (:func:`epochlens.device.autocast`); the representations are
computed from the activation raised to float32 either way. :mod:`epochlens.features.cache` streams
the batches into the per-epoch HDF5 file.

Measured difference of a 16-bit forward from a float32 one on the CPU (``benchmarks/features.py
--precision``: ResNet-18 and the digits CNN, randomly initialised, one batch of random images; the
largest absolute difference relative to the largest value of each layer and representation):
bfloat16 up to 6e-3 (pooled), 1.5e-2 (stats), 2e-3 (spectral); float16 up to 6e-4, 9e-4 and 2e-4
(ResNet-18).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from epochlens.device import autocast, model_device
from epochlens.errors import LayerError
from epochlens.features import representations as reps
from epochlens.features.settings import RepresentationSettings
from epochlens.features.spectral import PendingSpectral
from epochlens.features.workspace import Workspace
from epochlens.models.layers import channels_first, check_finite_weights, resolve_layers
from epochlens.progress import progress_bar


class _Capture:
    """Forward hooks that turn each layer's output into representations (on its device)."""

    def __init__(self, net: nn.Module, layers: Sequence[str], settings: RepresentationSettings) -> None:
        self.settings = settings
        self.workspace = Workspace()  # scratch buffers, reused from layer to layer and batch to batch
        self.out: dict[str, dict[str, torch.Tensor | PendingSpectral]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.calls: dict[str, int] = {}
        modules = dict(net.named_modules())
        self.handles = [modules[name].register_forward_hook(self._hook(name)) for name in layers]
        self.layers = list(layers)

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            if not isinstance(output, torch.Tensor) or output.ndim < 2:
                what = type(output).__name__
                if isinstance(output, torch.Tensor):
                    what += f" of shape {tuple(output.shape)}"
                raise LayerError(
                    f"layer {name!r} ({type(module).__name__}) returns {what}, not a (batch, ...) "
                    "tensor; hook another module (e.g. its parent block)."
                )
            output = channels_first(output)  # (batch, tokens, features) -> (B, D, T)
            self.shapes[name] = tuple(output.shape[1:])
            self.out[name] = reps.compute(output.float(), self.settings, workspace=self.workspace)

        return hook

    def run(self, net: nn.Module, x: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        self.out, self.calls = {}, {}
        net(x)
        for name in self.layers:
            calls = self.calls.get(name, 0)
            if calls != 1:
                raise LayerError(
                    f"layer {name!r} ran {calls} times in one forward pass; its output is ambiguous "
                    "(a module reused inside the model, or not used at all). Hook a module that runs "
                    "exactly once, such as the enclosing block."
                )
        return reps.finish(self.out)  # on a GPU: the spectral eigenvalues of all layers at once

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@contextmanager
def _prepared(
    model: nn.Module, device: torch.device | str | None
) -> Iterator[tuple[nn.Module, torch.device]]:
    device = model_device(model, device)
    net = copy.deepcopy(model).to(device).eval().requires_grad_(False)
    check_finite_weights(net)
    yield net, device


BatchFn = Callable[[int, int], torch.Tensor]


def iter_feature_batches(
    model: nn.Module,
    batches: BatchFn,
    n_samples: int,
    layers: Sequence[str],
    settings: RepresentationSettings,
    batch_size: int,
    device: torch.device | str | None = None,
    progress: bool = False,
    desc: str = "features",
    precision: str = "float32",
) -> Iterator[tuple[int, int, dict[str, dict[str, np.ndarray]], dict[str, tuple[int, ...]]]]:
    """Yield ``(lo, hi, features, shapes)`` per batch of samples lo..hi.

    ``batches(lo, hi)`` returns the normalised inputs (hi - lo, C, H, W); ``features[layer][rep]``
    is a float32 array (hi - lo, d); ``shapes[layer]`` the per-sample activation shape.
    ``precision``: the forward pass's (float32, bfloat16, float16: autocast where the device has it).
    Nothing waits for the device inside a batch: each batch's features are copied to the host
    once, after its forward pass.
    """
    with _prepared(model, device) as (net, dev):
        capture = _Capture(net, layers, settings)
        bar = progress_bar(total=n_samples, unit="image", disable=not progress, desc=desc)
        try:
            with torch.no_grad(), autocast(dev, precision):
                for lo in range(0, n_samples, batch_size):
                    hi = min(lo + batch_size, n_samples)
                    x = batches(lo, hi).to(dev, torch.float32, non_blocking=True)
                    out = capture.run(net, x)
                    host = {layer: {r: t.cpu().numpy() for r, t in out[layer].items()} for layer in layers}
                    yield lo, hi, host, dict(capture.shapes)
                    bar.update(hi - lo)
        finally:
            capture.close()
            bar.close()


def extract_features(
    model: nn.Module,
    images: torch.Tensor | np.ndarray,
    layers: Sequence[str] | None = None,
    settings: RepresentationSettings | None = None,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    progress: bool = False,
    precision: str = "float32",
) -> dict[str, dict[str, np.ndarray]]:
    """In-memory features of ``images`` (N, C, H, W), already normalised.

    Returns ``features[layer][representation]`` float32 arrays (N, d), layers resolved by
    :func:`resolve_layers`; ``precision`` that of the forward pass (:func:`iter_feature_batches`).
    For large data sets use :func:`load_or_extract`, which streams to disk.
    """
    settings = settings or RepresentationSettings()
    images = torch.as_tensor(images)
    names = resolve_layers(model, layers)
    if len(images) == 0:
        raise ValueError("images is empty: nothing to extract")
    parts: dict[str, dict[str, list[np.ndarray]]] = {n: {} for n in names}
    for _, _, feats, _ in iter_feature_batches(
        model,
        lambda lo, hi: images[lo:hi],
        len(images),
        names,
        settings,
        batch_size,
        device,
        progress,
        precision=precision,
    ):
        for layer, by_rep in feats.items():
            for r, arr in by_rep.items():
                parts[layer].setdefault(r, []).append(arr)
    return {layer: {r: np.concatenate(a) for r, a in by_rep.items()} for layer, by_rep in parts.items()}
