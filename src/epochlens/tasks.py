"""The run's task: the loss every per-sample analysis works from (per-sample loss, curvature, influence).

A :class:`Task` says, for a batch of samples (see :mod:`epochlens.batches`):

* how the batch splits into model inputs and targets (:meth:`Task.split_batch`) and how the model
  is called with the inputs (:func:`call_model`: ``model(x)``, ``model(*x)`` or ``model(**x)``);
* which tensor of the model's output is the prediction z (:class:`OutputAdapter`: the tensor itself,
  an item of a tuple, a field of a dict or of a Hugging Face ``ModelOutput``, ``logits`` by default);
* the per-sample loss ℓ_n(z_n, y_n), shape (B,), differentiable in z (:meth:`Task.loss`). Row n may
  depend only on sample n's prediction and targets (the model runs in eval mode, so rows of a batch
  do not interact and one backward pass gives every sample's own gradient);
* the measurement f(z_q) whose gradient a query contributes to influence (:meth:`Task.measurement`,
  the loss by default; kronfluence's ``compute_measurement``);
* the output-space curvature H_n = ∂²ℓ_n/∂z_n², the matrix that makes the Gauss-Newton matrix
  G = 1/N Σ_n J_nᵀ H_n J_n, in two forms:
  - :meth:`Task.sample_targets` draws targets ŷ from the model's predictive distribution, whose
    negative log-likelihood ℓ is; then E_ŷ[∇_z ℓ(z, ŷ) ∇_z ℓ(z, ŷ)ᵀ] = H (the "true" Fisher);
  - :meth:`Task.fisher_vectors` returns vectors v_k with Σ_k v_k v_kᵀ = H_n exactly (the "expected"
    Fisher; one backward pass per vector: for tests and tiny models);
* which positions of a sequence are real tokens (:meth:`Task.position_mask`, (B, T), or a tuple of
  masks of different lengths): layers with a token dimension leave the others (padding) out of their
  covariances and gradients.

Built-ins:

* :class:`ClassificationTask` — cross-entropy over the logits of the active classes (class-
  incremental runs), all classes when ``active_classes`` is None. True Fisher: a class drawn from
  softmax(z); expected: √p_c (p − e_c) for every class c, Σ_c = diag(p) − ppᵀ.
* :class:`RegressionTask` — squared error. Per-sample loss ``mean`` (default, as ``nn.MSELoss``
  over a sample's D outputs) ℓ = ‖z − y‖²/D, or ``sum`` ℓ = ‖z − y‖². H = (2/D)·I or 2·I, the Fisher
  of a Gaussian N(z, σ²I) with σ² = D/2 (mean) or 1/2 (sum): ℓ is that Gaussian's negative
  log-likelihood up to a constant, so the true Fisher draws ŷ = z + σε, ε ~ N(0, I).
* :class:`LanguageModelTask` — token-level cross-entropy of a causal LM: logits (B, T, V) at position
  t predict token t + 1 (``shift``). Targets are ``labels`` (Hugging Face convention, -100 = ignored,
  e.g. prompt tokens) or, without labels, the input ids where ``attention_mask`` is 1. Per-sample loss:
  the mean NLL of the sample's target tokens. H is block-diagonal over positions,
  (diag p_t − p_t p_tᵀ)/T_n; the true Fisher draws one token per target position, its gradient
  weighted by √T_n (:meth:`Task.fisher_weight`: the mean is 1/T_n times an NLL).
* :class:`TextToTextTask` — the same loss for an encoder-decoder (T5, BART): the decoder labels go
  in with the inputs, logits at t predict label t (no shift); encoder and decoder positions masked
  apart (one mask per token dimension).
* :class:`LossFunctionTask` — a user's per-sample loss function ``fn(prediction, targets) -> (B,)``,
  with an optional sampler for the true Fisher; its expected Fisher is the generic one.
* a user's :class:`Task` subclass or instance, by import path ``"package.module:name"``
  (:func:`task_from_config`).

Per-sample random draws are pure functions of (seed, global sample index, draw number)
(:func:`sample_uniforms`), so results do not depend on batching or sharding.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from epochlens.errors import ConfigError
from epochlens.outcome import squared_error

# ------------------------------------------------------------------ per-sample random draws
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_LABEL_STREAM = np.uint64(0x1F1F1F1F)  # separates this use of the seed from others


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def sample_uniforms(seed: int, sample_indices: np.ndarray, count: int | None = None) -> np.ndarray:
    """Uniforms in [0, 1), pure functions of (seed, global sample index, draw j) (SplitMix64).

    Returns:
        (B,) with ``count`` None (draw 0), else (B, count) float64.
    """
    idx = np.asarray(sample_indices).astype(np.uint64)
    k = 1 if count is None else int(count)
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed % 2**64], dtype=np.uint64) ^ _LABEL_STREAM)
        base = _mix64(idx ^ key)[:, None]
        steps = (np.arange(1, k + 1, dtype=np.uint64) * _GAMMA)[None, :]
        words = _mix64(base + steps)
    u = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return u[:, 0] if count is None else u


class Uniforms:
    """``uniforms(k)`` -> (B, k) float64 uniforms in [0, 1) on ``device`` for a batch's samples.

    Each call starts after the draws of the previous ones, so a task may ask several times.
    """

    def __init__(self, seed: int, sample_indices: np.ndarray, device: torch.device | str = "cpu") -> None:
        self.seed, self.indices, self.device, self._used = seed, np.asarray(sample_indices), device, 0

    def __call__(self, k: int) -> torch.Tensor:
        u = sample_uniforms(self.seed, self.indices, self._used + k)[:, self._used :]
        self._used += k
        return torch.as_tensor(u, device=self.device)

    def normal(self, k: int) -> torch.Tensor:
        """(B, k) standard normal draws (Box-Muller on two uniforms each)."""
        u = self(2 * k)
        u1, u2 = 1.0 - u[:, :k], u[:, k:]  # u1 in (0, 1]: log is finite
        return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


# ------------------------------------------------------------------ model calls and outputs
def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a Mapping, ``model(*inputs)`` for a tuple/list, else ``model(inputs)``."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


class OutputAdapter:
    """Extracts the prediction tensor from a model's output.

    Args:
        field: for a dict or ``ModelOutput``, the key or attribute (default ``"logits"``); for a tuple
            or list, an int index (a non-integer field takes item 0); a tensor is returned as is.
    """

    def __init__(self, field: str | int | None = "logits") -> None:
        self.field = "logits" if field is None else field

    def __call__(self, outputs: Any) -> torch.Tensor:
        out = outputs
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, Mapping) or hasattr(out, "keys"):  # dict, ModelOutput (an OrderedDict)
            if isinstance(self.field, str) and self.field in out.keys():
                out = out[self.field]
            elif isinstance(self.field, int):
                out = list(out.values())[self.field]
            else:
                raise ConfigError(
                    f"the model returned a {type(outputs).__name__} with fields {list(out.keys())}, none "
                    f"named {self.field!r}; set the task's output field to the one holding the predictions."
                )
        elif isinstance(out, (tuple, list)):
            out = out[self.field if isinstance(self.field, int) else 0]
        elif isinstance(self.field, str) and hasattr(out, self.field):
            out = getattr(out, self.field)
        if not isinstance(out, torch.Tensor):
            raise ConfigError(
                f"the model's output {type(outputs).__name__} gives a {type(out).__name__} at field "
                f"{self.field!r}, not a tensor; set the task's output field to the predictions' field."
            )
        return out

    def key(self) -> str | int:
        return self.field


def _batch_inputs_targets(batch: Any, labels_key: str = "labels") -> tuple[Any, Any]:
    if isinstance(batch, Mapping):
        inputs = {k: v for k, v in batch.items() if k != labels_key}
        return inputs, batch.get(labels_key)
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1:
            return batch[0], None
        raise ConfigError(
            f"a batch is a {type(batch).__name__} of {len(batch)} items; the default task reads (inputs,) "
            "or (inputs, targets). Return those from the dataset, or override Task.split_batch."
        )
    return batch, None


# ------------------------------------------------------------------ the task interface
class Task:
    """A run's loss (see the module doc). Subclass it and override :meth:`loss` at least.

    Attributes:
        name: shown in messages and stored in cache keys.
        output: the :class:`OutputAdapter` that picks the prediction from the model's output.
    """

    name = "task"

    def __init__(self, output: str | int | None = "logits") -> None:
        self.output = OutputAdapter(output)

    # -- batches and the model
    def split_batch(self, batch: Any) -> tuple[Any, Any]:
        """(model inputs, targets) of a batch: a dict without its ``labels`` and the labels, the two
        items of an (inputs, targets) tuple, or the batch itself and None."""
        return _batch_inputs_targets(batch)

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        """The model's output on ``inputs`` (see :func:`call_model`)."""
        return call_model(model, inputs)

    def prediction(self, outputs: Any) -> torch.Tensor:
        """The prediction tensor z (B, ...) the loss is a function of."""
        return self.output(outputs)

    # -- the loss and its curvature
    def scorable(self, inputs: Any, targets: Any) -> torch.Tensor | None:
        """(B,) bool: samples the task can compute a loss for (None: all). Others are not computed
        and get NaN results; they are not reported as errors (e.g. labels of inactive classes)."""
        return None

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        """Per-sample loss (B,), differentiable in ``prediction`` (given in float64)."""
        raise NotImplementedError(f"task {self.name!r} must implement loss(prediction, targets, inputs)")

    def measurement(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        """What a query's influence measures, (B,); default: the loss at the query's targets."""
        return self.loss(prediction, targets, inputs)

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        """Targets drawn from the model's predictive distribution at ``prediction`` (true Fisher)."""
        raise ConfigError(
            f"task {self.name!r} defines no predictive distribution to draw targets from, which the "
            "'true' Fisher needs; use influence fisher 'empirical' or 'expected', or give the task a "
            "sample_targets method."
        )

    def fisher_weight(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor | None:
        """(B,) factor on the sampled gradient so that E[w² ∇ℓ(ŷ)∇ℓ(ŷ)ᵀ] = H (None: 1).

        1 when the loss is the predictive distribution's negative log-likelihood. A loss that is c
        times an NLL (a mean over T tokens: c = 1/T) has H = c·H_NLL but a sampled gradient of
        covariance c²·H_NLL: w = 1/√c.
        """
        return None

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        """Vectors v_k shaped like ``prediction`` with Σ_k v_k v_kᵀ = H_n per sample (expected Fisher).

        Generic: H_n from automatic differentiation of the loss (one Hessian-vector product per
        output coordinate D, all samples at once), eigendecomposed per sample; v_k = √λ_k u_k, negative
        eigenvalues (a loss that is not convex in z) clamped to 0. D vectors.
        """
        z = prediction.detach().to(torch.float64)
        b, shape = z.shape[0], z.shape[1:]
        d = int(np.prod(shape)) if len(shape) else 1
        if d > 4096:
            raise ConfigError(
                f"task {self.name!r}: the expected Fisher needs {d} backward passes (one per output "
                "coordinate); use influence fisher 'true' or 'empirical'."
            )
        zz = z.clone().requires_grad_(True)
        with torch.enable_grad():
            grad = torch.autograd.grad(self.loss(zz, targets, inputs).sum(), zz, create_graph=True)[0]
            flat = grad.reshape(b, d)
            cols = []
            for j in range(d):
                (h,) = torch.autograd.grad(flat[:, j].sum(), zz, retain_graph=j < d - 1, allow_unused=True)
                cols.append(torch.zeros(b, d, dtype=z.dtype) if h is None else h.reshape(b, d))
        hess = torch.stack(cols, dim=2)  # (B, D, D): column j = ∂grad/∂z_j
        hess = (hess + hess.transpose(1, 2)) / 2
        values, vectors = torch.linalg.eigh(hess)
        roots = values.clamp_min(0.0).sqrt()
        return [(vectors[:, :, k] * roots[:, k : k + 1]).reshape(b, *shape) for k in range(d)]

    def position_mask(self, inputs: Any) -> torch.Tensor | None:
        """(B, T) bool: positions that are real tokens (None: all). Default: an ``attention_mask``.

        A model with several token dimensions (an encoder-decoder's) gives a tuple of masks of
        different lengths; a layer takes the one whose length is its input's."""
        if isinstance(inputs, Mapping) and inputs.get("attention_mask") is not None:
            return inputs["attention_mask"].bool()
        return None

    def key(self) -> dict:
        """What the task is, for cache keys and metadata (JSON-able)."""
        return {"name": self.name, "output": self.output.key()}


def _check_loss_shape(value: torch.Tensor, n: int, task: Task) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.shape != (n,):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(
            f"task {task.name!r} returned a loss of shape {shape} for a batch of {n} samples; it must "
            f"return one loss per sample, shape ({n},) (no mean over the batch)."
        )
    return value


# ------------------------------------------------------------------ classification
class ClassificationTask(Task):
    """Cross-entropy over the logits of the active classes (all classes if ``active_classes`` is None).

    Targets are class ids (B,); a sample whose class is not active is not scorable. The prediction is
    the logits restricted to the active classes, in ``active_classes`` order, (B, A).
    """

    name = "classification"

    def __init__(
        self, active_classes: np.ndarray | list[int] | None = None, output: str | int | None = "logits"
    ):
        super().__init__(output)
        if active_classes is None:
            self.active = None
        else:
            active = np.asarray(active_classes, dtype=np.int64)
            if (
                active.ndim != 1
                or len(active) == 0
                or len(np.unique(active)) != len(active)
                or active.min() < 0
            ):
                raise ConfigError(
                    f"active_classes must be distinct non-negative class ids, at least one; got {active}"
                )
            self.active = active
        self._lookup: dict[torch.device, torch.Tensor] = {}

    def prediction(self, outputs: Any) -> torch.Tensor:
        z = self.output(outputs)
        if z.ndim != 2:
            raise ConfigError(
                f"classification: the prediction has shape {tuple(z.shape)}, expected logits (batch, "
                "classes); pick the logits with the task's output field, or use the language_model task."
            )
        if self.active is None:
            return z
        if self.active.max() >= z.shape[1]:
            raise ConfigError(
                f"classification: active class {int(self.active.max())} but the model has {z.shape[1]} "
                "outputs; the class schedule does not fit the model."
            )
        return z.index_select(1, torch.as_tensor(self.active, device=z.device))

    def positions(self, targets: torch.Tensor, n_classes: int | None = None) -> torch.Tensor:
        """Position of each class id among the active classes (-1: not active), (B,) int64."""
        t = torch.as_tensor(targets).long()
        if self.active is None:
            bad = (t < 0) | (t >= n_classes) if n_classes is not None else t < 0
            return torch.where(bad, torch.full_like(t, -1), t)
        dev = t.device
        if dev not in self._lookup:
            size = int(self.active.max()) + 1
            lookup = torch.full((size,), -1, dtype=torch.long)
            lookup[torch.as_tensor(self.active)] = torch.arange(len(self.active))
            self._lookup[dev] = lookup.to(dev)
        lookup = self._lookup[dev]
        inside = (t >= 0) & (t < len(lookup))
        return torch.where(inside, lookup[t.clamp(0, len(lookup) - 1)], torch.full_like(t, -1))

    def scorable(self, inputs: Any, targets: Any) -> torch.Tensor | None:
        if targets is None:
            return None
        t = torch.as_tensor(targets)
        if t.ndim != 1 or t.is_floating_point():
            raise ConfigError(
                f"classification: targets must be class ids, a 1-D integer array; got {t.dtype} of shape "
                f"{tuple(t.shape)}. For continuous targets use the regression task."
            )
        return self.positions(t) >= 0

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        if targets is None:
            raise ConfigError("classification: the batch has no labels; its items must be (inputs, label)")
        pos = self.positions(torch.as_tensor(targets, device=prediction.device), prediction.shape[1])
        logp = torch.log_softmax(prediction, dim=1)
        picked = logp.gather(1, pos.clamp_min(0)[:, None])[:, 0]
        return torch.where(pos >= 0, -picked, torch.full_like(picked, math.nan))

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        p = torch.nan_to_num(torch.softmax(prediction.detach().to(torch.float64), dim=1), nan=0.0)
        u = uniforms(1)[:, 0].to(p.device)
        cdf = p.cumsum(1)
        pos = (cdf < u[:, None] * cdf[:, -1:]).sum(1).clamp_max(p.shape[1] - 1)
        if self.active is None:
            return pos
        return torch.as_tensor(self.active, device=pos.device)[pos]

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        p = torch.nan_to_num(torch.softmax(prediction.detach().to(torch.float64), dim=1), nan=0.0)
        eye = torch.eye(p.shape[1], dtype=p.dtype, device=p.device)
        return [p.clamp_min(0).sqrt()[:, c : c + 1] * (p - eye[c]) for c in range(p.shape[1])]

    def key(self) -> dict:
        active = None if self.active is None else [int(c) for c in self.active]
        return {"name": self.name, "output": self.output.key(), "active_classes": active}


# ------------------------------------------------------------------ regression
class RegressionTask(Task):
    """Squared error between the prediction (B, ...) and targets of the same number of values.

    Args:
        reduction: ``mean`` (default): ℓ = ‖z − y‖²/D over a sample's D outputs, as ``nn.MSELoss``;
            ``sum``: ℓ = ‖z − y‖². Output Hessian H = (2/D)·I or 2·I; the true Fisher draws
            ŷ = z + σε with σ² = D/2 or 1/2 (the Gaussian whose NLL ℓ is).
        output: the prediction's field in the model output.
    """

    name = "regression"

    def __init__(self, reduction: str = "mean", output: str | int | None = "logits") -> None:
        super().__init__(output)
        if reduction not in ("mean", "sum"):
            raise ConfigError(f"regression: reduction={reduction!r} must be 'mean' or 'sum'")
        self.reduction = reduction

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        if targets is None:
            raise ConfigError("regression: the batch has no targets; its items must be (inputs, target)")
        try:
            return squared_error(prediction, torch.as_tensor(targets), self.reduction)
        except ValueError as exc:
            raise ConfigError(f"regression: {exc}") from None

    def _variance(self, d: int) -> float:
        return d / 2.0 if self.reduction == "mean" else 0.5

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        z = prediction.detach().to(torch.float64).reshape(prediction.shape[0], -1)
        eps = uniforms.normal(z.shape[1]).to(z.device)
        return (z + math.sqrt(self._variance(z.shape[1])) * eps).reshape(prediction.shape)

    def fisher_vectors(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> list[torch.Tensor]:
        b, d = prediction.shape[0], int(np.prod(prediction.shape[1:])) if prediction.ndim > 1 else 1
        c = math.sqrt(2.0 / d) if self.reduction == "mean" else math.sqrt(2.0)
        eye = torch.eye(d, dtype=torch.float64, device=prediction.device) * c
        return [eye[j].expand(b, d).reshape(prediction.shape).clone() for j in range(d)]

    def key(self) -> dict:
        return {"name": self.name, "output": self.output.key(), "reduction": self.reduction}


# ------------------------------------------------------------------ language models
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


# ------------------------------------------------------------------ a user's loss function
class LossFunctionTask(Task):
    """A task from a per-sample loss function ``fn(prediction, targets) -> (B,)``.

    Args:
        fn: the loss; must return one value per sample, each depending on that sample only.
        sample: optional ``sample(prediction, targets, uniforms) -> targets`` drawing from the model's
            predictive distribution (for the true Fisher); ``uniforms`` is a :class:`Uniforms`.
        measurement: optional ``measurement(prediction, targets) -> (B,)`` for queries.
        output: the prediction's field in the model output.
        name: for messages and cache keys.
        kwargs: keyword arguments of ``fn`` (e.g. ``{"reduction": "none"}``).
    """

    def __init__(
        self,
        fn: Callable,
        sample: Callable | None = None,
        measurement: Callable | None = None,
        output: str | int | None = "logits",
        name: str | None = None,
        kwargs: Mapping | None = None,
    ) -> None:
        super().__init__(output)
        self.fn, self.sampler, self.measure = fn, sample, measurement
        self.kwargs = dict(kwargs or {})
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"

    def loss(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        return self.fn(prediction, targets, **self.kwargs)

    def measurement(self, prediction: torch.Tensor, targets: Any, inputs: Any) -> torch.Tensor:
        return (
            self.loss(prediction, targets, inputs)
            if self.measure is None
            else self.measure(prediction, targets)
        )

    def sample_targets(self, prediction: torch.Tensor, targets: Any, inputs: Any, uniforms: Uniforms) -> Any:
        if self.sampler is None:
            return super().sample_targets(prediction, targets, inputs, uniforms)
        return self.sampler(prediction, targets, uniforms)

    def key(self) -> dict:
        return {"name": self.name, "output": self.output.key(), "kwargs": self.kwargs}


# ------------------------------------------------------------------ from a config
BUILTIN_TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "regression": RegressionTask,
    "language_model": LanguageModelTask,
    "text_to_text": TextToTextTask,
}


def import_object(spec: str, search_path: str | None = None, what: str = "task") -> Any:
    """The object named ``"package.module:attribute"`` (``search_path`` put first on ``sys.path``).

    Raises:
        ConfigError: a malformed spec, a module that cannot be imported, or a missing attribute.
    """
    if ":" not in spec:
        raise ConfigError(f"{what} {spec!r}: give an import path 'package.module:name'")
    module_name, _, attr = spec.partition(":")
    if search_path and search_path not in sys.path:
        sys.path.insert(0, str(search_path))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"{what} {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc}). Check the "
            "spelling, and that its folder is on the import path (the config's path)."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def task_from_config(
    spec: str | Mapping | Task | None = None, active_classes: np.ndarray | list[int] | None = None
) -> Task:
    """A :class:`Task` from a run's config.

    Args:
        spec: None or ``"classification"`` (the default), ``"regression"``, ``"language_model"``, an
            import path ``"package.module:name"`` of a Task subclass, a Task instance or a per-sample
            loss function, or a mapping ``{"name": ..., "output": ..., "path": ..., **arguments}``:
            ``path`` is put on the import path; the other keys are the task class's arguments (a
            ``kwargs`` mapping is merged into them), or for a loss function ``sample`` and
            ``measurement`` (import paths too) and ``kwargs`` (the function's keyword arguments).
            A Task instance is returned as is.
        active_classes: the classes of a classification task (None: all).

    Raises:
        ConfigError: an unknown name, an import that fails, or arguments the task does not take.
    """
    if isinstance(spec, Task):
        return spec
    kwargs: dict = {}
    path = None
    if spec is None:
        name = "classification"
    elif isinstance(spec, str):
        name = spec
    elif isinstance(spec, Mapping):
        kwargs = dict(spec)
        name = kwargs.pop("name", kwargs.pop("kind", "classification"))
        path = kwargs.pop("path", None)
    else:
        raise ConfigError(f"task: {spec!r} is not a task name, an import path or a mapping")
    if name == "classification":
        kwargs.setdefault("active_classes", active_classes)
    if name in BUILTIN_TASKS:
        kwargs = {**kwargs, **kwargs.pop("kwargs", {})}
        return _construct(BUILTIN_TASKS[name], kwargs, name)
    if ":" not in name:
        raise ConfigError(
            f"task: {name!r} is not one of {sorted(BUILTIN_TASKS)} nor an import path 'package.module:name'"
        )
    obj = import_object(name, path)
    if isinstance(obj, Task):
        if kwargs:
            raise ConfigError(f"task {name!r} is an instance; it takes no arguments (got {sorted(kwargs)})")
        return obj
    if inspect.isclass(obj):
        if not issubclass(obj, Task):
            raise ConfigError(
                f"task {name!r} is a class that does not derive from epochlens.tasks.Task; derive from it "
                "(override loss, and sample_targets for the true Fisher)."
            )
        kwargs = {**kwargs, **kwargs.pop("kwargs", {})}
        return _construct(obj, kwargs, name)
    if callable(obj):
        for k in ("sample", "measurement"):
            if isinstance(kwargs.get(k), str):
                kwargs[k] = import_object(kwargs[k], path, what=f"task {k}")
        kwargs.setdefault("name", name)
        return _construct(LossFunctionTask, {"fn": obj, **kwargs}, name)
    raise ConfigError(f"task {name!r} is a {type(obj).__name__}, not a Task, a Task class or a loss function")


def _construct(cls: type, kwargs: dict, name: str) -> Any:
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"task {name!r}: {exc}. Fix the task's arguments in the config.") from exc


def per_sample_loss(
    task: Task, prediction: torch.Tensor, targets: Any, inputs: Any, measurement: bool = False
) -> torch.Tensor:
    """The task's loss (or measurement) per sample, checked to be (B,)."""
    fn = task.measurement if measurement else task.loss
    return _check_loss_shape(fn(prediction, targets, inputs), prediction.shape[0], task)


__all__ = [
    "BUILTIN_TASKS",
    "ClassificationTask",
    "LanguageModelTask",
    "LossFunctionTask",
    "OutputAdapter",
    "RegressionTask",
    "Task",
    "TextToTextTask",
    "Uniforms",
    "call_model",
    "import_object",
    "per_sample_loss",
    "sample_uniforms",
    "task_from_config",
]
