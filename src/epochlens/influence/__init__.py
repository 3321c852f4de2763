"""Influence of training samples on queries, with curvature that does not fail on real checkpoints.

Modules, one concept each:

* :mod:`.settings`      ``InfluenceSettings`` (method ekfac|kfac|diagonal|identity, Fisher type,
  damping, layers, batch sizes, query memory, dtypes) and what each choice means;
* :mod:`.layers`        which modules are tracked (Linear, Conv2d, GPT-2 Conv1D by name patterns;
  tied and reused modules as one layer), per-sample inputs (KFC unfolded patches, token positions
  with padding masked, bias as a ones column) and output gradients via hooks;
* :mod:`.gradients`     the task's per-sample loss and its back-propagated vectors per Fisher type,
  the model prepared in place (no copy), underflow-safe scaling and flags;
* :mod:`.factors`       covariance accumulation in float64 (NaN/Inf samples skipped and reported),
  eigendecomposition, EK-FAC eigenvalue correction, diagonal;
* :mod:`.eigen`         robust symmetric eigendecomposition (finite checks, CPU fallback);
* :mod:`.damping`       relative damping, refusal of zero/underflowing damping, the ladder;
* :mod:`.precondition`  damped inverses per layer and the diagnostics table;
* :mod:`.scores`        pairwise (Q, N) and self (N,) influence;
* :mod:`.tracin`        TracIn over checkpoints; :mod:`.accumulate` sums per-checkpoint scores;
* :mod:`.io`            factors files with a cache key;
* :mod:`.study_factors`, :mod:`.study_scores`  one checkpoint of a run for the data-quality
  study: factors and their spectrum; scores with queries, TracIn and metadata.

Errors are in :mod:`epochlens.errors`. The names below are imported on first use (PEP 562), so
that ``import epochlens.influence.settings`` does not import torch.

The loss comes from the run's task (:mod:`epochlens.tasks`): classification over the active classes
by default, or regression, token-level language modelling, or a user's task; data are in-memory arrays
with labels, or Datasets/DataLoaders with tensor, tuple or dict batches (:mod:`epochlens.batches`).

Typical use::

    settings = InfluenceSettings(method="ekfac")
    factors = fit_factors(model, x_train, y_train, active, settings)
    pair = pairwise_influence(model, factors, x_train, y_train, x_query, y_query, active, settings)
    self_ = self_influence(model, factors, x_train, y_train, active, settings)
    pair.diagnostics  # layer, cond, min_eig, max_eig, damping, damping_steps, ...

    # any task, any Dataset / DataLoader (labels inside the batches):
    task = LanguageModelTask()
    factors = fit_factors(model, train_ds, settings=settings, task=task)
    pair = pairwise_influence(model, factors, train_ds, None, query_ds, None, settings=settings, task=task)
"""

from epochlens._lazy import attach

_EXPORTS = {
    "ClassificationTask": "epochlens.tasks.classification",
    "LanguageModelTask": "epochlens.tasks.language",
    "LossFunctionTask": "epochlens.tasks.user",
    "RegressionTask": "epochlens.tasks.regression",
    "Task": "epochlens.tasks.base",
    "task_from_config": "epochlens.tasks.choose",
    "DIAGNOSTIC_COLUMNS": "precondition",
    "FISHERS": "settings",
    "METHODS": "settings",
    "DampingError": "epochlens.errors",
    "EigenError": "epochlens.errors",
    "Eigh": "eigen",
    "FactorCacheError": "epochlens.errors",
    "InfluenceError": "epochlens.errors",
    "InfluenceFactors": "factors",
    "InfluenceSettings": "settings",
    "LayerFactors": "factors",
    "LayerInfo": "layers",
    "LayerSelectionError": "epochlens.errors",
    "NoFiniteSamplesError": "epochlens.errors",
    "PairwiseScores": "scores",
    "Preconditioner": "precondition",
    "SelfScores": "scores",
    "damping_ladder": "damping",
    "factor_cache_key": "io",
    "factor_diagnostics": "precondition",
    "fit_factors": "factors",
    "fit_checkpoint_factors": "study_factors",
    "factor_spectrum": "study_factors",
    "checkpoint_scores": "study_scores",
    "CheckpointScores": "study_scores",
    "gradient_to_parameters": "layers",
    "initial_damping": "damping",
    "load_factors": "io",
    "load_or_fit_factors": "io",
    "pairwise_influence": "scores",
    "per_sample_gradients": "scores",
    "save_factors": "io",
    "save_table": "io",
    "select_layers": "layer_selection",
    "self_influence": "scores",
    "state_dict_sha256": "io",
    "symmetric_eigh": "eigen",
    "tracin_pairwise": "tracin",
    "tracin_self": "tracin",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
