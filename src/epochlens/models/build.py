"""The untrained model of a run the pipeline trains: a built-in network for images (``model.name``)
or, for a text run, a transformer built from ``model.hf.config`` returning its logits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from epochlens.data import Dataset
from epochlens.data.text import TextDataset
from epochlens.models.networks import build_model


def build_untrained(model: Mapping[str, Any], data: Dataset | TextDataset, seed: int) -> nn.Module:
    """The run's model (its ``model`` section) for ``data``, initialised from ``seed``."""
    if "hf" not in model:
        return build_model(model["name"], data.num_classes, data.train_images.shape[1], seed=seed)
    from epochlens.models.hf import build_hf_model
    from epochlens.models.outputs import attach_output_adapter

    hf = model["hf"]
    net = build_hf_model(
        hf["config"], hf["task"], data.num_classes, data.pad_token_id, seed, hf["attention"], data.vocab_size
    )
    attach_output_adapter(net, "logits")
    return net
