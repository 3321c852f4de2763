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

Modules, one task family each: :mod:`.base` (the interface), :mod:`.classification`,
:mod:`.regression`, :mod:`.language` (causal and encoder-decoder LMs), :mod:`.user` (a loss
function), :mod:`.choose` (from a config); :mod:`.calls` (model calls and outputs) and :mod:`.draws`
(per-sample random draws) serve them all. The names below are imported on first use (PEP 562), so a
module that needs one name depends on (and reruns with) that name's module only.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "BUILTIN_TASKS": "choose",
    "ClassificationTask": "classification",
    "LanguageModelTask": "language",
    "LossFunctionTask": "user",
    "OutputAdapter": "calls",
    "RegressionTask": "regression",
    "Task": "base",
    "TextToTextTask": "language",
    "Uniforms": "draws",
    "call_model": "calls",
    "import_object": "choose",
    "per_sample_loss": "base",
    "sample_uniforms": "draws",
    "task_from_config": "choose",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
