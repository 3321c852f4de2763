"""Module names of the built-in models, known without torch.

The configuration is checked while the workflow is planned, which must not import torch (seconds
and hundreds of MB per dry run): a layer name in ``features.layers`` or ``ablation.blocks`` that
a built-in model does not have is an error before any job runs. The lists mirror
``named_modules()`` of :mod:`epochlens.models.networks` (a unit test asserts they are equal);
models that are not built in are checked when their job builds them
(:func:`epochlens.models.layers.resolve_layers`).
"""

from __future__ import annotations


def _small_cnn() -> list[str]:
    names = []
    for b in (1, 2, 3):
        names += [f"block{b}", *(f"block{b}.{k}" for k in range(3))]  # conv, bn, relu
    return [*names, "pool", "fc"]


def _resnet18_lop() -> list[str]:
    names = ["conv1", "bn1", "relu"]
    for i in range(1, 5):
        names.append(f"layer{i}")
        for j in range(2):
            block = f"layer{i}.{j}"
            names += [block, *(f"{block}.{m}" for m in ("conv1", "bn1", "relu", "conv2", "bn2"))]
            if i > 1 and j == 0:  # stride 2 and more channels: a 1x1-conv downsample
                names += [f"{block}.downsample", f"{block}.downsample.0", f"{block}.downsample.1"]
    return [*names, "output_pool", "fc"]


#: Every module name (``named_modules()`` without the root) of each built-in model, in order.
LAYERS: dict[str, list[str]] = {"small_cnn": _small_cnn(), "resnet18_lop": _resnet18_lop()}
#: The block outputs that ``layers: null`` means (:func:`epochlens.models.layers.default_layers`).
DEFAULT_LAYERS: dict[str, list[str]] = {
    "small_cnn": ["block1", "block2", "block3"],
    "resnet18_lop": [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)],
}


def known_layers(model_name: str) -> list[str] | None:
    """Module names of a built-in model; None for any other model (checked when its job runs)."""
    return LAYERS.get(model_name)
