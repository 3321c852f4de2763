"""Per-layer features of a text run's transformer: hidden states reduced over each sequence's tokens.

Which layers: ``None`` (the default) is every transformer block's output, found by module name
(:func:`epochlens.models.hf_catalog.layout_of`: BERT's ``bert.encoder.layer.N``, GPT-2's
``transformer.h.N``, Llama's ``model.layers.N``, T5's encoder blocks; the decoder blocks of an
encoder-decoder model only with text-to-text data, whose decoder labels give their tokens), or a
list of module names
whose output is a (batch, tokens, features) tensor or a tuple that starts with one, as blocks of
older ``transformers`` versions return. Block ``N``'s output is ``hidden_states[N + 1]`` of
``model(..., output_hidden_states=True)`` (for GPT-2 and Llama the last entry has the final norm
applied as well; a block's output has not).

A forward hook on each layer turns its output ``h`` (B, T, D) into, with ``m`` the attention mask
(B, T) (1 = a real token, 0 = padding, on either side):

* ``mean``: ``sum_t m[b, t] h[b, t] / sum_t m[b, t]``, (B, D): the mean over the real tokens;
* ``last``: ``h[b, t_last(b)]`` with ``t_last(b)`` the last position where ``m[b] == 1``, (B, D): the
  token a GPT-2-style classifier reads its logits from (with right padding; it is also the last
  token with left padding);
* ``first``: ``h[b, t_first(b)]`` with ``t_first(b)`` the first position where ``m[b] == 1``, (B, D)
  (a text-to-text model's, below).

A language model's sequence is a prompt followed by its target tokens (token labels ``y`` (B, T),
aligned with the input ids, -100 where a position is not a target: the prompt and the padding;
the loss is the mean NLL of the target tokens). Its representations:

* ``target_mean``: ``sum_t g[b, t] h[b, t] / sum_t g[b, t]`` with ``g = (y != -100) & m``, (B, D):
  the mean over the target tokens' positions;
* ``prompt_last``: ``h[b, f(b) - 1]`` with ``f(b)`` the first target position, (B, D): the last
  prompt token, whose output predicts the first target token (the state the model answers from).

A text-to-text (encoder-decoder) model's sequences are a prompt, the encoder's input, and a target,
the decoder's labels ``y`` (B, T) (-100 on the padding), from which the model builds its decoder
inputs (shifted right, the start token first: teacher forcing, as in training and in its loss).
Each block's ``mean`` and ``first`` are taken over that block's own tokens, with the mask ``m``
above being:

* an encoder block's (``encoder.block.N``): the prompt's attention mask, so ``mean`` is the mean
  over the prompt's real tokens and ``first`` the prompt's first token (T5 has no CLS token; these
  are Sentence-T5's two encoder poolings);
* a decoder block's (``decoder.block.N``) and the head's: ``y != -100``, the target positions, so
  ``mean`` is the mean over them and ``first`` position 0, whose input is the decoder start token
  and whose output predicts the first target token (the state the model answers from, having
  read the prompt through cross-attention; it sees no target token).

Encoder block ``N``'s output is ``encoder_hidden_states[N + 1]`` and decoder block ``N``'s
``decoder_hidden_states[N + 1]`` of ``model(input_ids, attention_mask, labels=y,
output_hidden_states=True)`` (the last of each has T5's final layer norm applied as well; a
block's output has not). Layers of the decoder side are found as the modules of
``model.get_decoder()`` and the head.

Padding never enters a representation: with right padding, adding padding columns changes nothing
(up to rounding; on either side of a text-to-text model). Values are computed in the activations'
dtype (float32, or float64 for a float64 model; half precision is raised to float32). A sequence
without a real token is an error.

:func:`load_or_extract_text` writes them in the image features' file (:mod:`epochlens.features.cache`:
``/{split}/{layer}/{mean|last}`` (N, D), ``activation_shape`` (D, T), the same attributes), so
:mod:`epochlens.probes` reads them unchanged. Its cache key hashes the checkpoint, the data key
(:func:`text_data_key`: the token ids, masks, labels and the tokenizer's fingerprint, so another
tokenizer or max_length rebuilds the file) and :meth:`TextFeatureSettings.spec`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from epochlens.data.text import IGNORE_INDEX, TextDataset
from epochlens.device import model_device
from epochlens.errors import FeatureError, LayerError
from epochlens.features.cache import (
    CacheResult,
    cached_or_written,
    write_feature_file,
)
from epochlens.features.extract import _prepared
from epochlens.features.text_settings import (
    KIND_REPRESENTATIONS,
    LM_REPRESENTATIONS,
    TEXT_REPRESENTATIONS,
    TextFeatureSettings,
)
from epochlens.models.layers import resolve_layers
from epochlens.progress import progress_bar

InputsFn = Callable[[int, int], Mapping[str, torch.Tensor]]


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the last real token (``mask == 1``) of each row of ``mask`` (B, T)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).amax(1)


def first_positions(mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the first real token (``mask == 1``) of each row of ``mask`` (B, T)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, mask.shape[1]).amin(1)


def text_representations(
    hidden: torch.Tensor,
    mask: torch.Tensor,
    names: Sequence[str] = TEXT_REPRESENTATIONS,
    labels: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``mean``, ``first``, ``last``, ``prompt_last`` and/or ``target_mean`` (B, D) of hidden states
    (B, T, D) under the mask (B, T) of their tokens (the attention mask; a text-to-text decoder's
    ``labels != -100``); the last two need a language model's token ``labels`` (B, T)."""
    if hidden.ndim != 3 or hidden.shape[:2] != mask.shape:
        raise ValueError(
            f"hidden states {tuple(hidden.shape)} must be (B, T, D) with mask {tuple(mask.shape)}"
        )
    h = hidden.detach()
    if h.dtype not in (torch.float32, torch.float64):
        h = h.float()
    masks = {"mean": mask, "last": mask, "first": mask}
    if any(n in LM_REPRESENTATIONS for n in names):
        masks.update(_lm_masks(mask, labels))
    out = {}
    for name in names:
        if name not in masks:
            raise ValueError(
                f"unknown text representation {name!r} (choose from "
                f"{[*TEXT_REPRESENTATIONS, 'first', *LM_REPRESENTATIONS]})"
            )
        m = masks[name].to(h.device, h.dtype)
        count = m.sum(1, keepdim=True)
        if bool((count == 0).any()):
            what = {"prompt_last": "prompt token", "target_mean": "target token"}.get(name, "real token")
            raise FeatureError(
                f"sequences {torch.nonzero(count[:, 0] == 0).flatten()[:10].tolist()} of the batch have "
                f"no {what} (representation {name}); check the tokenised data."
            )
        if name in ("mean", "target_mean"):
            out[name] = (h * m.unsqueeze(2)).sum(1) / count
        else:
            at = (first_positions if name == "first" else last_positions)(masks[name].to(h.device))
            out[name] = h[torch.arange(len(h), device=h.device), at]
    return out


def _lm_masks(mask: torch.Tensor, labels: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """(B, T) bool masks of a language model's representations: ``target_mean``'s target positions
    and ``prompt_last``'s prompt positions (real tokens before the first target)."""
    if labels is None or labels.shape != mask.shape:
        shape = None if labels is None else tuple(labels.shape)
        raise FeatureError(
            f"{list(LM_REPRESENTATIONS)} need the token labels (B, T) of the {tuple(mask.shape)} "
            f"batch (got {shape}): a language model's data (prompt_column and target_column)."
        )
    real = mask.bool()
    target = (labels.to(mask.device) != IGNORE_INDEX) & real
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    first = torch.where(target, positions, mask.shape[1]).amin(1, keepdim=True)
    return {"target_mean": target, "prompt_last": real & (positions < first)}


def default_text_layers(model: nn.Module, decoder: bool = False) -> list[str]:
    """Every transformer block of ``model`` whose tokens are the input's, in forward order; with
    ``decoder`` (text-to-text data) an encoder-decoder model's decoder blocks as well."""
    from epochlens.models.hf_catalog import layout_of

    layout = layout_of(model)
    keep = layout.causal or decoder
    return [b for b, s in zip(layout.blocks, layout.stacks, strict=True) if keep or s != "decoder"]


def resolve_text_layers(model: nn.Module, layers: Sequence[str] | None, decoder: bool = False) -> list[str]:
    """Module names of a layer spec; None gives :func:`default_text_layers`."""
    return default_text_layers(model, decoder) if layers is None else resolve_layers(model, layers)


def is_encoder_decoder(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face encoder-decoder model (T5, BART, ...)."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def decoder_side_layers(model: nn.Module, layers: Sequence[str]) -> set[str]:
    """The layers of ``layers`` that run over an encoder-decoder model's decoder positions: the
    modules of ``model.get_decoder()`` and its head (none for other models)."""
    if not is_encoder_decoder(model):
        return set()
    inside = {id(m) for m in model.get_decoder().modules()}
    head = model.get_output_embeddings()
    if head is not None:
        inside.add(id(head))
    modules = dict(model.named_modules())
    return {name for name in layers if id(modules[name]) in inside}


class _TextCapture:
    """Forward hooks that turn each layer's hidden states into its representations (on its device):
    an encoder-decoder model's decoder-side layers under the decoder labels' mask when the inputs
    carry them (text-to-text data), every other layer under the attention mask."""

    def __init__(self, net: nn.Module, layers: Sequence[str], names: Sequence[str]) -> None:
        self.layers, self.names = list(layers), tuple(names)
        self.seq2seq = is_encoder_decoder(net)
        self.decoder = decoder_side_layers(net, self.layers)
        self.mask = torch.zeros(0)
        self.decoder_mask: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.out: dict[str, dict[str, torch.Tensor]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.calls: dict[str, int] = {}
        modules = dict(net.named_modules())
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in self.layers]

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            hidden = output[0] if isinstance(output, tuple | list) and output else output
            decoder = name in self.decoder and self.decoder_mask is not None
            mask = self.decoder_mask if decoder else self.mask
            if not isinstance(hidden, torch.Tensor) or hidden.ndim != 3 or hidden.shape[:2] != mask.shape:
                what = (
                    f"shape {tuple(hidden.shape)}"
                    if isinstance(hidden, torch.Tensor)
                    else type(hidden).__name__
                )
                raise LayerError(
                    f"layer {name!r} ({type(module).__name__}) returns {what}, not hidden states "
                    f"(batch, tokens, features) of the {tuple(mask.shape)} "
                    f"{'decoder labels' if decoder else 'input'}; hook a block."
                )
            self.shapes[name] = (int(hidden.shape[2]), int(hidden.shape[1]))  # (D, T): channels first
            labels = None if self.seq2seq else self.labels  # a causal LM's, aligned with the input
            self.out[name] = text_representations(hidden, mask, self.names, labels)

        return hook

    def run(self, net: nn.Module, inputs: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
        inputs = dict(inputs)
        # a causal LM's token labels: masks only; a text-to-text model's: its decoder's inputs too
        self.labels = inputs.get("labels") if self.seq2seq else inputs.pop("labels", None)
        self.decoder_mask = None
        if self.seq2seq and self.labels is not None:
            self.decoder_mask = self.labels != IGNORE_INDEX
        self.out, self.calls, self.mask = {}, {}, inputs["attention_mask"]
        net(**inputs)
        for name in self.layers:
            if self.calls.get(name, 0) != 1:
                raise LayerError(
                    f"layer {name!r} ran {self.calls.get(name, 0)} times in one forward pass; hook a "
                    "module that runs exactly once, such as a transformer block."
                )
        return self.out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def iter_text_feature_batches(
    model: nn.Module,
    inputs: InputsFn,
    n_samples: int,
    layers: Sequence[str],
    names: Sequence[str] = TEXT_REPRESENTATIONS,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    progress: bool = False,
    desc: str = "features",
) -> Iterator[tuple[int, int, dict[str, dict[str, np.ndarray]], dict[str, tuple[int, ...]]]]:
    """Yield ``(lo, hi, features, shapes)`` per batch of sequences lo..hi.

    ``inputs(lo, hi)`` returns the model's keyword inputs (``input_ids``, ``attention_mask`` (B, T)
    ...; a language model's token ``labels`` (B, T) for its representations, not given to the
    model; a text-to-text model's decoder ``labels`` (B, T'), given to it);
    ``features[layer][name]`` is an array (hi - lo, D) in the activations' dtype; ``shapes[layer]``
    is (D, T) (a decoder-side layer's T: the labels'). The model runs in eval mode without
    gradients, on a copy.
    """
    with _prepared(model, device) as (net, dev):
        capture = _TextCapture(net, layers, names)
        bar = progress_bar(total=n_samples, unit="sequence", disable=not progress, desc=desc)
        try:
            with torch.no_grad():
                for lo in range(0, n_samples, batch_size):
                    hi = min(lo + batch_size, n_samples)
                    batch = {k: v.to(dev, non_blocking=True) for k, v in inputs(lo, hi).items()}
                    out = capture.run(net, batch)
                    host = {layer: {r: t.cpu().numpy() for r, t in out[layer].items()} for layer in layers}
                    yield lo, hi, host, dict(capture.shapes)
                    bar.update(hi - lo)
        finally:
            capture.close()
            bar.close()


def extract_text_features(
    model: nn.Module,
    inputs: Mapping[str, torch.Tensor | np.ndarray],
    layers: Sequence[str] | None = None,
    names: Sequence[str] = TEXT_REPRESENTATIONS,
    batch_size: int = 256,
    device: torch.device | str | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """In-memory features of ``inputs`` (``input_ids``, ``attention_mask`` (N, T), ...; an
    encoder-decoder model's decoder ``labels`` (N, T'), which add its decoder blocks to the default
    layers): ``features[layer][name]`` arrays (N, D) in the model's dtype, layers by
    :func:`resolve_text_layers`."""
    tensors = {k: torch.as_tensor(v) for k, v in inputs.items()}
    n = len(tensors["attention_mask"])
    if n == 0:
        raise ValueError("inputs are empty: nothing to extract")
    parts: dict[str, dict[str, list[np.ndarray]]] = {}
    batches = iter_text_feature_batches(
        model,
        lambda lo, hi: {k: v[lo:hi] for k, v in tensors.items()},
        n,
        resolve_text_layers(model, layers, decoder="labels" in tensors and is_encoder_decoder(model)),
        names,
        batch_size,
        device,
    )
    for _, _, feats, _ in batches:
        for layer, by_rep in feats.items():
            for r, arr in by_rep.items():
                parts.setdefault(layer, {}).setdefault(r, []).append(arr)
    return {layer: {r: np.concatenate(a) for r, a in by_rep.items()} for layer, by_rep in parts.items()}


def feature_inputs(data: TextDataset, split: str, rows: np.ndarray) -> dict[str, torch.Tensor]:
    """The model's keyword inputs of samples ``rows`` of ``split``, with a language model's token
    ``labels`` (its representations' masks; never given to the model)."""
    inputs = data.inputs(split, rows)
    if data.kind != "classification":
        inputs["labels"] = torch.from_numpy(np.ascontiguousarray(data.labels(split)[rows]))
    return inputs


def _check_kind(data: TextDataset, names: Sequence[str]) -> None:
    """Each kind of text data takes its representations (:data:`KIND_REPRESENTATIONS`)."""
    fits = KIND_REPRESENTATIONS[data.kind]
    wrong = [n for n in names if n not in fits]
    if wrong:
        raise FeatureError(
            f"representations {wrong} do not fit {data.kind} data; its representations are {list(fits)}."
        )


def text_data_key(data: TextDataset) -> str:
    """SHA-256 of the text data's content hash (ids, masks, labels, the tokenizer's fingerprint)."""
    payload = json.dumps({"kind": "text", "content_hash": data.content_hash}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def load_or_extract_text(
    path: str | Path,
    model: nn.Module | Callable[[], nn.Module],
    data: TextDataset,
    checkpoint_sha256: str,
    settings: TextFeatureSettings | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> CacheResult:
    """Features of a text checkpoint from ``path`` if cached under the same key, else extracted and
    written (as :func:`epochlens.features.cache.load_or_extract`; ``model`` may be a function that
    builds it, called on a cache miss only)."""
    settings = settings or TextFeatureSettings()
    _check_kind(data, settings.names)

    def write(net: nn.Module) -> None:
        write_text_features(path, net, data, checkpoint_sha256, settings, device, progress)

    return cached_or_written(path, model, checkpoint_sha256, text_data_key(data), settings.spec(), write)


def write_text_features(
    path: str | Path,
    model: nn.Module,
    data: TextDataset,
    checkpoint_sha256: str,
    settings: TextFeatureSettings | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> None:
    """Extract the features of ``data`` and write them to ``path`` atomically (the layout of
    :mod:`epochlens.features.cache`)."""
    settings = settings or TextFeatureSettings()
    layers = resolve_text_layers(model, settings.layers, decoder=data.kind == "text_to_text")
    t0 = time.perf_counter()
    run_device = model_device(model, device)

    def batches(split: str, n: int) -> Iterator:
        return iter_text_feature_batches(
            model,
            lambda lo, hi: feature_inputs(data, split, np.arange(lo, hi)),
            n,
            layers,
            settings.names,
            settings.batch_size,
            run_device,
            progress,
            desc=f"features {split}",
        )

    extra = dict(
        format_version=settings.spec()["format_version"],
        kind="text",
        tokenizer=data.tokenizer,
        representations=list(settings.names),
    )
    write_feature_file(
        path,
        model,
        data,
        settings,
        batches,
        checkpoint_sha256,
        text_data_key(data),
        layers,
        run_device,
        t0,
        extra,
    )
