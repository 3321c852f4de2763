"""The user's regression model and its factory ``build``: an MLP from a flattened matrix (9 values)
to its flattened inverse (9 values), trained with the mean squared error."""

from __future__ import annotations

import torch
from torch import nn


class InverseMLP(nn.Module):
    """``depth`` hidden layers of ``hidden`` units with Tanh, then a linear head; the input is
    flattened, so (N, 9) vectors and (N, 1, 3, 3) matrices both work."""

    def __init__(self, in_features: int = 9, num_outputs: int = 9, hidden: int = 32, depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.Tanh()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.flatten(1)))


def build(in_features: int = 9, num_outputs: int = 9, hidden: int = 32, depth: int = 2) -> InverseMLP:
    return InverseMLP(in_features, num_outputs, hidden, depth)
