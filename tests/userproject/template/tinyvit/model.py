"""tinyvit's classifier and its factory ``build``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers import Block, PatchEmbed


class TinyViT(nn.Module):
    """Patch embedding + class token + position embedding, ``depth`` blocks, LayerNorm, linear head.

    ``forward(pixel_values, labels=None)`` returns ``{"logits": (N, classes)}`` and, given labels,
    ``"loss"`` as well (the Hugging Face Trainer's convention).
    """

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_chans: int = 3,
        num_classes: int = 3,
        dim: int = 16,
        depth: int = 2,
        heads: int = 2,
        mlp_ratio: int = 2,
    ) -> None:
        super().__init__()
        tokens = (image_size // patch_size) ** 2
        self.patch_embed = PatchEmbed(in_chans, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        x = self.patch_embed(pixel_values)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def build(
    num_classes: int = 3, dim: int = 16, depth: int = 2, heads: int = 2, image_size: int = 8
) -> TinyViT:
    """The factory named in the config: ``model.factory: "tinyvit.model:build"``."""
    return TinyViT(image_size=image_size, num_classes=num_classes, dim=dim, depth=depth, heads=heads)
