"""Language models: token-level cross-entropy of a causal LM and of an encoder-decoder."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from epochlens.errors import ConfigError
from epochlens.tasks.base import Task
from epochlens.tasks.calls import _batch_inputs_targets
from epochlens.tasks.draws import Uniforms


class LanguageModelTask(Task):
    """Token-level cross-entropy of a (causal) language model; per-sample loss = mean NLL of its targets.

    Batches: a dict ``{"input_ids", "attention_mask"?, "labels"?}`` (Hugging Face style), an
    (inputs, labels) tuple, or a tensor of input ids. Targets: ``labels`` aligned with the input ids,
    ``ignore_index`` where a position is not a target (prompt tokens, padding); without labels, the
    input ids where ``attention_mask`` is 1. With ``shift`` (causal LMs) the logits at position t
    predict target t + 1, as Hugging Face's loss does.

    Args:
        output: field of the model output holding the logits (B, T, V).
        ignore_index: target value of positions that are not targets.
        shift: logits at t predict the target at t + 1.
        input_key, mask_key, labels_key: names in dict batches.
    """

    name = "language_model"

    def __init__(
        self,
        output: str | int | None = "logits",
        ignore_index: int = -100,
        shift: bool = True,
        input_key: str = "input_ids",
        mask_key: str = "attention_mask",
        labels_key: str = "labels",
    ) -> None:
        super().__init__(output)
        self.ignore_index, self.shift = int(ignore_index), bool(shift)
        self.input_key, self.mask_key, self.labels_key = input_key, mask_key, labels_key

    def split_batch(self, batch: Any) -> tuple[Any, Any]:
        return _batch_inputs_targets(batch, self.labels_key)

    def position_mask(self, inputs: Any) -> torch.Tensor | None:
        if isinstance(inputs, Mapping) and inputs.get(self.mask_key) is not None:
            return inputs[self.mask_key].bool()
        return None

    def _ids(self, inputs: Any) -> torch.Tensor:
        if isinstance(inputs, Mapping):
            if self.input_key not in inputs:
                raise ConfigError(
                    f"language_model: the batch has no {self.input_key!r} (keys {list(inputs)}); set the "
                    "task's input_key, or give labels."
                )
            return inputs[self.input_key]
        if isinstance(inputs, torch.Tensor):
            return inputs
        raise ConfigError("language_model: give labels, or inputs that are input ids or a dict with them")

    def targets_and_mask(self, targets: Any, inputs: Any, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(target ids (B, T'), bool mask (B, T')) aligned with the logits' positions 0..T'-1."""
        if targets is None:
            labels = self._ids(inputs).long()
            mask = self.position_mask(inputs)
            valid = torch.ones_like(labels, dtype=torch.bool) if mask is None else mask.bool()
        else:
            labels = torch.as_tensor(targets).long()
            valid = labels != self.ignore_index
        if self.shift:
            labels, valid = labels[:, 1:], valid[:, 1:]
        if labels.shape[1] != length:
            raise ConfigError(
                f"language_model: {labels.shape[1]} target positions for logits of {length} positions "
                f"(shift={self.shift}); labels must be aligned with the input ids."
            )
        return torch.where(valid, labels, torch.zeros_like(labels)), valid

    def _logits(self, prediction: torch.Tensor) -> torch.Tensor:
        if prediction.ndim != 3:
            raise ConfigError(
                f"language_model: the prediction has shape {tuple(prediction.shape)}, expected logits "
                "(batch, positions, vocabulary)."
            )
        return prediction[:, :-1] if self.shift else prediction

    def scorable(self, inputs: Any, targets: Any) -> torch.Tensor | None:
        ids = self._ids(inputs) if targets is None else torch.as_tensor(targets)
        n = ids.shape[1] - int(self.shift)
        _, valid = self.targets_and_mask(targets, inputs, n)
        return valid.any(1)

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        z = self._logits(prediction)
        tgt, valid = self.targets_and_mask(targets, inputs, z.shape[1])
        tgt, valid = tgt.to(z.device), valid.to(z.device)
        nll = -torch.log_softmax(z, dim=2).gather(2, tgt[:, :, None])[:, :, 0]
        nll = torch.where(valid, nll, torch.zeros_like(nll))
        count = valid.sum(1)
        return torch.where(count > 0, nll.sum(1) / count.clamp_min(1), torch.full_like(nll[:, 0], math.nan))

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        z = self._logits(prediction.detach().to(torch.float64))
        _, valid = self.targets_and_mask(targets, inputs, z.shape[1])
        p = torch.nan_to_num(torch.softmax(z, dim=2), nan=0.0)
        u = uniforms(z.shape[1]).to(p.device)  # one draw per position
        cdf = p.cumsum(2)
        drawn = (cdf < u[:, :, None] * cdf[:, :, -1:]).sum(2).clamp_max(p.shape[2] - 1)
        drawn = torch.where(valid.to(p.device), drawn, torch.full_like(drawn, self.ignore_index))
        if not self.shift:
            return drawn
        first = torch.full_like(drawn[:, :1], self.ignore_index)
        return torch.cat([first, drawn], dim=1)

    def fisher_weight(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor | None:
        """√T_n: the loss is the sequence's NLL divided by its T_n target tokens."""
        z = self._logits(prediction)
        _, valid = self.targets_and_mask(targets, inputs, z.shape[1])
        return valid.sum(1).clamp_min(1).to(torch.float64).sqrt()

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        """One vector per (target position t, token c): √(p_tc / T_n) (p_t − e_c) at position t."""
        full = prediction.detach().to(torch.float64)
        z = self._logits(full)
        _, valid = self.targets_and_mask(targets, inputs, z.shape[1])
        valid = valid.to(z.device)
        b, t_len, v = z.shape
        if t_len * v > 16384:
            raise ConfigError(
                f"language_model: the expected Fisher needs {t_len * v} backward passes (positions x "
                "vocabulary); use influence fisher 'true' or 'empirical'."
            )
        p = torch.nan_to_num(torch.softmax(z, dim=2), nan=0.0)
        count = valid.sum(1).clamp_min(1).to(p.dtype)
        eye = torch.eye(v, dtype=p.dtype, device=p.device)
        out = []
        for t in range(t_len):
            weight = torch.where(valid[:, t], 1.0 / count, torch.zeros_like(count))  # (B,)
            for c in range(v):
                vec = torch.zeros_like(full)
                row = (p[:, t, c] * weight).clamp_min(0).sqrt()[:, None] * (p[:, t] - eye[c])
                vec[:, t] = row  # position t of the logits (the shift drops the last one)
                out.append(vec)
        return out

    def key(self) -> dict:
        return {
            "name": self.name,
            "output": self.output.key(),
            "ignore_index": self.ignore_index,
            "shift": self.shift,
        }


class TextToTextTask(LanguageModelTask):
    """Token-level cross-entropy of an encoder-decoder (text-to-text) model, e.g. T5 or BART.

    A batch is a dict ``{"input_ids", "attention_mask", "labels"}``: the encoder's inputs (B, S)
    and the decoder's labels (B, T), -100 at padding. The model is called with the labels among its
    inputs (it builds its decoder inputs from them, teacher forcing) and its logits at decoder
    position t predict label t: no shift. Per-sample loss: the mean NLL of the target tokens,
    transformers' own loss of that sample alone.

    Two token dimensions: the encoder's layers (and the decoder's cross-attention keys and values)
    see the S encoder positions, the decoder's layers and the head the T decoder positions.
    :meth:`position_mask` gives both masks, (attention_mask (B, S), labels != -100 (B, T)), and a
    layer takes the one whose length matches its input's; where S = T, :meth:`split_batch` appends
    one -100 column to the labels (a decoder position after every target: the decoder is causal, so
    neither the targets' logits nor the loss change) so that the lengths tell the stacks apart.
    """

    name = "text_to_text"

    def __init__(
        self,
        output: str | int | None = "logits",
        ignore_index: int = -100,
        input_key: str = "input_ids",
        mask_key: str = "attention_mask",
        labels_key: str = "labels",
    ) -> None:
        super().__init__(output, ignore_index, False, input_key, mask_key, labels_key)

    def split_batch(self, batch: Any) -> tuple[Any, Any]:
        if not isinstance(batch, Mapping) or self.labels_key not in batch or self.input_key not in batch:
            raise ConfigError(
                f"text_to_text: a batch is a dict with {self.input_key!r} (the encoder's inputs) and "
                f"{self.labels_key!r} (the decoder's labels); got "
                f"{list(batch) if isinstance(batch, Mapping) else type(batch).__name__}."
            )
        inputs = dict(batch)
        labels = torch.as_tensor(inputs[self.labels_key])
        if labels.ndim == 2 and labels.shape[1] == torch.as_tensor(inputs[self.input_key]).shape[1]:
            pad = torch.full_like(labels[:, :1], self.ignore_index)
            inputs[self.labels_key] = labels = torch.cat([labels, pad], dim=1)
        return inputs, labels

    def position_mask(self, inputs: Any) -> tuple[torch.Tensor, ...] | None:
        """(encoder mask (B, S), decoder mask (B, T)) bool: real encoder tokens, target positions."""
        if not isinstance(inputs, Mapping) or self.labels_key not in inputs:
            return None
        decoder = torch.as_tensor(inputs[self.labels_key]) != self.ignore_index
        encoder = inputs.get(self.mask_key)
        if encoder is None:
            encoder = torch.ones_like(torch.as_tensor(inputs[self.input_key]), dtype=torch.bool)
        return (encoder.bool(), decoder)

    def key(self) -> dict:
        return {"name": self.name, "output": self.output.key(), "ignore_index": self.ignore_index}
