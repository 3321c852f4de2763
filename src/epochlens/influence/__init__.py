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
* :mod:`.scores`        pairwise (Q, N) and self (N,) influence, TracIn over checkpoints;
* :mod:`.io`            factors files with a cache key.

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

from epochlens.influence.damping import damping_ladder, initial_damping
from epochlens.influence.eigen import Eigh, symmetric_eigh
from epochlens.influence.errors import (
    DampingError,
    EigenError,
    FactorCacheError,
    InfluenceError,
    LayerSelectionError,
    NoFiniteSamplesError,
)
from epochlens.influence.factors import InfluenceFactors, LayerFactors, fit_factors
from epochlens.influence.io import (
    factor_cache_key,
    load_factors,
    load_or_fit_factors,
    save_factors,
    save_table,
    state_dict_sha256,
)
from epochlens.influence.layers import LayerInfo, gradient_to_parameters, select_layers
from epochlens.influence.precondition import DIAGNOSTIC_COLUMNS, Preconditioner, factor_diagnostics
from epochlens.influence.scores import (
    PairwiseScores,
    SelfScores,
    pairwise_influence,
    per_sample_gradients,
    self_influence,
    tracin_pairwise,
    tracin_self,
)
from epochlens.influence.settings import FISHERS, METHODS, InfluenceSettings
from epochlens.tasks import (
    ClassificationTask,
    LanguageModelTask,
    LossFunctionTask,
    RegressionTask,
    Task,
    task_from_config,
)

__all__ = [
    "ClassificationTask",
    "LanguageModelTask",
    "LossFunctionTask",
    "RegressionTask",
    "Task",
    "task_from_config",
    "DIAGNOSTIC_COLUMNS",
    "FISHERS",
    "METHODS",
    "DampingError",
    "EigenError",
    "Eigh",
    "FactorCacheError",
    "InfluenceError",
    "InfluenceFactors",
    "InfluenceSettings",
    "LayerFactors",
    "LayerInfo",
    "LayerSelectionError",
    "NoFiniteSamplesError",
    "PairwiseScores",
    "Preconditioner",
    "SelfScores",
    "damping_ladder",
    "factor_cache_key",
    "factor_diagnostics",
    "fit_factors",
    "gradient_to_parameters",
    "initial_damping",
    "load_factors",
    "load_or_fit_factors",
    "pairwise_influence",
    "per_sample_gradients",
    "save_factors",
    "save_table",
    "select_layers",
    "self_influence",
    "state_dict_sha256",
    "symmetric_eigh",
    "tracin_pairwise",
    "tracin_self",
]
