"""Query transforms of the poison study: perturbed copies of the queries, each scored separately,
so that the agreement of the influence rankings across them can be measured
(:func:`epochlens.study.detection.transform_agreement`).

Images (normalised, (Q, C, H, W)):

* ``hflip``: mirrored left-right;
* ``noise``: plus Gaussian noise of std ``noise_std`` in normalised units;
* ``crop``: zero-padded by ``pad`` pixels, then cropped back at a seeded random offset per image
  (a shift of up to ``pad`` pixels).

Texts (a text model's keyword inputs ``input_ids`` and ``attention_mask``, (Q, L) each). The first
and the last real token of every query are kept (a BERT's ``[CLS]`` and ``[SEP]``; the token a
GPT-2-style classifier reads); the inner ones:

* ``token_dropout``: each dropped with probability ``drop_fraction``, as if the words were deleted:
  the tokens left close up and the freed positions become padding (on the side the query was
  padded);
* ``truncate``: the first ``ceil(keep_fraction x inner)`` kept, the rest cut.

The random draws are pure functions of (``seed``, query position): the same queries give the same
transformed queries in every job. Kept in a module of its own: the data preparation imports the
corruptions, not these, so a change here reruns the influence scores only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from epochlens.errors import ConfigError
from epochlens.study.settings import IMAGE_QUERY_TRANSFORMS, QUERY_TRANSFORMS, TEXT_QUERY_TRANSFORMS


def transform_queries(
    queries: torch.Tensor | Mapping[str, torch.Tensor],
    kind: str,
    seed: int = 0,
    noise_std: float = 0.1,
    pad: int = 1,
    drop_fraction: float = 0.1,
    keep_fraction: float = 0.5,
    pad_token_id: int = 0,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """A transformed copy of the queries: normalised images, or a text model's keyword inputs
    (``pad_token_id``: the id of their padding, which GPT-2-style classifiers look for)."""
    if kind not in QUERY_TRANSFORMS:
        raise ConfigError(f"query transform {kind!r} must be one of {list(QUERY_TRANSFORMS)}")
    if isinstance(queries, Mapping):
        if kind in IMAGE_QUERY_TRANSFORMS:
            raise ConfigError(
                f"query transform {kind!r} transforms images; a text run takes "
                f"{['none', *TEXT_QUERY_TRANSFORMS]}."
            )
        if kind == "none":
            return {k: v.clone() for k, v in queries.items()}
        return transform_texts(queries, kind, seed, drop_fraction, keep_fraction, pad_token_id)
    if kind in TEXT_QUERY_TRANSFORMS:
        raise ConfigError(
            f"query transform {kind!r} transforms texts; an image run takes "
            f"{['none', *IMAGE_QUERY_TRANSFORMS]}."
        )
    images = torch.as_tensor(queries)
    if kind == "none":
        return images.clone()
    if kind == "hflip":
        return images.flip(-1)
    gen = torch.Generator().manual_seed(seed)
    if kind == "noise":
        noise = torch.randn(images.shape, generator=gen, dtype=torch.float64)
        return images + (noise_std * noise).to(images.dtype).to(images.device)
    if pad < 1:
        raise ConfigError(f"crop pad={pad} must be >= 1")
    h, w = images.shape[-2:]
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (len(images), 2), generator=gen)
    out = torch.empty_like(images)
    for i, (dy, dx) in enumerate(offsets.tolist()):
        out[i] = padded[i, :, dy : dy + h, dx : dx + w]
    return out


def transform_texts(
    inputs: Mapping[str, torch.Tensor],
    kind: str,
    seed: int = 0,
    drop_fraction: float = 0.1,
    keep_fraction: float = 0.5,
    pad_token_id: int = 0,
) -> dict[str, torch.Tensor]:
    """``token_dropout`` or ``truncate`` of keyword inputs (module doc); other keys are copied."""
    if not 0 <= drop_fraction < 1:
        raise ConfigError(f"influence.drop_fraction={drop_fraction} must be in [0, 1)")
    if not 0 < keep_fraction <= 1:
        raise ConfigError(f"influence.keep_fraction={keep_fraction} must be in (0, 1]")
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    new_ids, new_mask = torch.empty_like(ids), torch.zeros_like(mask)
    for q in range(len(ids)):
        real = torch.nonzero(mask[q], as_tuple=True)[0]
        inner = real[1:-1]
        if kind == "token_dropout":
            draws = np.random.default_rng([seed, q]).random(len(inner))
            kept = inner[torch.as_tensor(draws >= drop_fraction)]
        else:
            kept = inner[: math.ceil(keep_fraction * len(inner))]
        keep = torch.cat([real[:1], kept, real[-1:]]) if len(real) > 1 else real
        tokens = ids[q, keep]
        left = len(real) > 0 and int(real[0]) > 0 and bool(mask[q, -1])  # padded on the left
        new_ids[q] = pad_token_id
        where = slice(ids.shape[1] - len(tokens), None) if left else slice(0, len(tokens))
        new_ids[q, where], new_mask[q, where] = tokens, 1
    out = {k: v.clone() for k, v in inputs.items()}
    out.update(input_ids=new_ids, attention_mask=new_mask)
    return out
