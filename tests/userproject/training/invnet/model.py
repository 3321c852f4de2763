"""The user's model and its factory ``build``: an MLP on flattened 2x2 matrices (4 values)."""

from torch import nn


def build(in_features: int = 4, num_outputs: int = 2, hidden: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, num_outputs)
    )
