"""Model architectures and class-incremental logit restriction.

* ``small_cnn``: a three-block CNN for the embedded default (8x8 digits), seconds per epoch on a CPU.
* ``resnet18_lop``: the ResNet-18 variant of the loss-of-plasticity incremental CIFAR experiment
  (3x3 stride-1 stem, no max-pool, every convolution with a bias, BatchNorm, 1x1-conv downsample in
  the first block of layers 2-4, ``fc`` 512 -> classes). Its state_dict keys and shapes equal the
  original's, so users' ``index-{i}_epoch-{e}.pt`` files load unchanged.

In class-incremental training the network has an output for every class but the loss only sees the
logits of the classes trained so far: :func:`restrict_logits` selects them, and
:func:`positions_in` maps class ids to their position in that selection.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv(16) -> conv(32, /2) -> conv(64, /2) -> global average pool -> fc."""

    def __init__(self, num_classes: int, in_channels: int = 1) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            )

        self.block1 = block(in_channels, 16, 1)
        self.block2 = block(16, 32, 2)
        self.block3 = block(32, 64, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block3(self.block2(self.block1(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class BasicBlock(nn.Module):
    """ResNet basic block with biased 3x3 convolutions (loss-of-plasticity variant)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Sequential | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=True), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18LoP(nn.Module):
    """ResNet-18 as in ``lop/nets/torchvision_modified_resnet.py`` (same state_dict keys)."""

    def __init__(self, num_classes: int = 100, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        widths, strides = (64, 128, 256, 512), (1, 2, 2, 2)
        inplanes = 64
        for i, (planes, stride) in enumerate(zip(widths, strides, strict=True), start=1):
            layer = nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))
            setattr(self, f"layer{i}", layer)
            inplanes = planes
        self.output_pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        # Initialisation of the original experiment (kaiming_init_resnet_module).
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.kaiming_normal_(self.fc.weight, nonlinearity="linear")
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.output_pool(x), 1))


MODELS = {"small_cnn": SmallCNN, "resnet18_lop": ResNet18LoP}


def build_model(name: str, num_classes: int, in_channels: int, seed: int | None = None) -> nn.Module:
    """Instantiate a model by its config name (``small_cnn`` or ``resnet18_lop``).

    With ``seed`` the initial weights are a function of it (torch's global generator is left as
    it was); without, they come from the global generator.
    """
    try:
        cls = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}") from None
    if seed is None:
        return cls(num_classes=num_classes, in_channels=in_channels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(num_classes=num_classes, in_channels=in_channels)


def restrict_logits(logits: torch.Tensor, active_classes: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Logits of the active classes only, in class-order position: (B, num_active).

    ``active_classes`` may be a tensor already on the logits' device (the curvature engine keeps
    one there); a tensor is never converted through NumPy, which a CUDA tensor refuses.
    """
    if not isinstance(active_classes, torch.Tensor):
        active_classes = np.asarray(active_classes)
    idx = torch.as_tensor(active_classes, dtype=torch.long, device=logits.device)
    return logits.index_select(1, idx)


def positions_in(labels: np.ndarray, active_classes: np.ndarray) -> np.ndarray:
    """Position of each label in ``active_classes`` (the target for restricted logits); -1 if absent."""
    lookup = np.full(int(max(labels.max(initial=0), active_classes.max(initial=0))) + 1, -1)
    lookup[active_classes] = np.arange(len(active_classes))
    return lookup[labels].astype(np.int64)
