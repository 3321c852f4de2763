"""Layers whose output is (batch, tokens, features) — ViT and transformer blocks: the channels of
features and ablation are the features of every token (epochlens.models.layers.channels_first)."""

from __future__ import annotations

import torch
from torch import nn

from epochlens.ablation.ablate import UnitGroup, ablated, block_shapes, unit_means
from epochlens.features.extract import extract_features
from epochlens.features.settings import RepresentationSettings


class Tokens(nn.Module):
    """(B, C, H, W) -> 4 patch tokens of 6 features -> a residual MLP block -> mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(3 * 2 * 2, 6)
        self.block = nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 6))
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(len(x), 4, 12)
        tokens = self.embed(patches)
        tokens = tokens + self.block(tokens)
        return self.head(tokens.mean(1))


def _block_output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = {}
    handle = model.block.register_forward_hook(lambda m, i, o: out.setdefault("y", o.detach()))
    with torch.no_grad():
        model(x)
    handle.remove()
    return out["y"]  # (B, T=4, D=6)


def test_pooled_features_of_a_token_layer_average_over_its_tokens():
    model, x = Tokens().eval(), torch.randn(5, 3, 4, 4)
    feats = extract_features(model, x, ["block"], RepresentationSettings(names=("pooled",)))
    expected = _block_output(model, x).mean(1)  # by hand: (B, D)
    assert feats["block"]["pooled"].shape == (5, 6)
    torch.testing.assert_close(torch.from_numpy(feats["block"]["pooled"]), expected, rtol=1e-6, atol=1e-6)


def test_ablating_a_feature_group_of_a_token_layer_zeroes_those_features_of_every_token():
    model, x = Tokens().eval(), torch.randn(5, 3, 4, 4)
    assert block_shapes(model, ["block"], x[:1]) == {"block": (6, 4)}  # (features, tokens)
    block = _block_output(model, x)
    tokens = model.embed(x.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(5, 4, 12))
    with torch.no_grad():
        zeroed = block.clone()
        zeroed[..., 2:4] = 0  # by hand: features 2 and 3 of every token
        expected = model.head((tokens + zeroed).mean(1))
        with ablated(model, UnitGroup("block", "ch2-3", 2, 4), "zero"):
            got = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    means = unit_means(model, x, ["block"], batch_size=2)
    torch.testing.assert_close(
        means["block"].double(), block.transpose(1, 2).double().mean(0), rtol=1e-6, atol=1e-6
    )
