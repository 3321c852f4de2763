"""Settings of the influence engine (``InfluenceSettings``; :func:`influence_settings` builds them from a
run's config) and what each choice means.

Methods (how the Gauss-Newton matrix G of the mean training loss is approximated per layer):

* ``ekfac``: eigenvalue-corrected K-FAC (George et al. 2018): the eigenbasis of K-FAC's Kronecker
  factors, with eigenvalues refitted to the per-sample gradients in that basis.
* ``kfac``: K-FAC (Martens & Grosse 2015) for Linear (and GPT-2's Conv1D), KFC (Grosse & Martens
  2016) for Conv2d: G_layer ≈ S ⊗ A, A the covariance of the layer's inputs (unfolded patches for
  convolutions, real tokens for a token dimension, a ones column for the bias), S the covariance of
  the gradients of its outputs (pre-activations).
* ``diagonal``: the diagonal of G (squared per-sample gradients).
* ``identity``: no curvature; the influence is the gradient dot product (TracIn with one checkpoint).

Fisher types (the targets whose loss gradients the curvature is built from; the loss is the run's
task, :mod:`epochlens.tasks`, by default the cross-entropy over the active classes):

* ``true`` (default, as kronfluence): targets drawn from the model's own predictive distribution
  (one class per sample for classification, one token per target position for a language model,
  Gaussian outputs for regression). Its expectation is the GGN, at the cost of one backward pass
  per sample, and it does not use the data set's labels: a curvature built from possibly
  corrupted labels (``empirical``) would absorb the very samples a data-quality study looks for.
  The draw is a pure function of (seed, sample index), so results do not depend on batching.
* ``expected``: the exact expectation: one backward pass per vector of a square root of the loss's
  output Hessian (classification: every active class weighted by its probability), so the factors
  reproduce the GGN Jᵀ H_out J. For tests and tiny models.
* ``empirical``: the data set's labels (the "empirical Fisher"; biased, see Kunstner et al. 2019).

Fields whose metadata says ``execution`` (batch sizes, where eigendecompositions run) do not
change the results: the workflow leaves them out of the rules' params.

Damping λ is added to every eigenvalue of a layer's curvature before inverting. ``relative``
(default) scales ``damping`` by the mean eigenvalue of the layer (kronfluence's heuristic is 0.1),
so one setting suits layers whose curvature differs by orders of magnitude; ``absolute`` uses it
as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from epochlens.errors import ConfigError

METHODS = ("ekfac", "kfac", "diagonal", "identity")
#: Methods whose curvature factors are fitted (and cached) before scoring.
FACTOR_METHODS = ("ekfac", "kfac", "diagonal")
FISHERS = ("true", "expected", "empirical")
COMPUTE_DTYPES = ("auto", "model", "float32", "float64")
PRECONDITION_DTYPES = ("float64", "float32")

#: Identifies the factor computation; part of every cache key, bumped when the maths changes.
FACTOR_SCHEME = "epochlens-kfc-v1"


@dataclass
class InfluenceSettings:
    """How influence is computed. Fields named in :meth:`factor_key` decide the cached factors."""

    method: Literal["ekfac", "kfac", "diagonal", "identity"] = field(
        default="ekfac", metadata={"help": "curvature approximation: ekfac, kfac, diagonal or identity"}
    )
    fisher: Literal["true", "expected", "empirical"] = field(
        default="true",
        metadata={
            "help": "labels of the curvature's gradients: true (sampled from the model), expected "
            "(all active classes weighted by probability; exact GGN, one backward per class) or "
            "empirical (the data set's labels)"
        },
    )
    damping: float = field(
        default=0.1,
        metadata={"help": "damping λ: a factor of the layer's mean eigenvalue (relative) or absolute"},
    )
    damping_mode: Literal["relative", "absolute"] = field(
        default="relative", metadata={"help": "relative: λ = damping × mean eigenvalue of the layer"}
    )
    damping_growth: float = field(
        default=10.0, metadata={"help": "factor by which the ladder raises λ where a solve is not finite"}
    )
    max_damping_steps: int = field(
        default=30, metadata={"help": "ladder steps before a layer's solve is declared impossible"}
    )
    layers: tuple[str, ...] = field(
        default=(),
        metadata={"help": "fnmatch patterns of module names to track (Linear, Conv2d); empty: all"},
    )
    exclude_layers: tuple[str, ...] = field(
        default=(), metadata={"help": "fnmatch patterns of module names not to track"}
    )
    factor_batch_size: int = field(
        default=64,
        metadata={"help": "samples per forward/backward while fitting factors", "execution": True},
    )
    train_batch_size: int = field(
        default=32,
        metadata={
            "help": "training samples per forward/backward while scoring (memory: their per-sample "
            "gradient matrices are formed a chunk of samples at a time)",
            "execution": True,
        },
    )
    query_batch_size: int = field(
        default=16,
        metadata={
            "help": "queries per forward/backward while computing their preconditioned gradients",
            "execution": True,
        },
    )
    query_memory_gb: float = field(
        default=2.0,
        metadata={
            "help": "GiB for the preconditioned query gradients held while the training set is scored: "
            "all queries fit (Q x parameters x bytes, or the low-rank size) -> one pass over the "
            "training set; otherwise as many passes as groups of queries that fit",
            "execution": True,
        },
    )
    query_gradient_rank: int | None = field(
        default=None,
        metadata={
            "help": "keep each layer's preconditioned query gradient as its best rank-r approximation "
            "(truncated SVD, as kronfluence's query_gradient_rank): r(out + in) numbers instead of "
            "out x in, approximate scores; None: exact"
        },
    )
    compute_dtype: Literal["auto", "model", "float32", "float64"] = field(
        default="auto",
        metadata={
            "help": "dtype of forward/backward: auto (the model's, float16/bfloat16 promoted to "
            "float32), model (as is), float32 or float64. Factors are always accumulated in float64"
        },
    )
    precondition_dtype: Literal["float64", "float32"] = field(
        default="float64", metadata={"help": "dtype of per-sample gradients, solves and scores"}
    )
    eigh_float32_from: int | None = field(
        default=2048,
        metadata={
            "help": "factors of this dimension or more eigendecomposed in float32 (~3x faster); None: none"
        },
    )
    eigh_device: Literal["auto", "cpu"] = field(
        default="auto",
        metadata={"help": "auto: eigendecompose on the compute device, CPU fallback", "execution": True},
    )
    eigh_workers: int = field(
        default=1,
        metadata={"help": "eigendecompositions of the layers' factors at once (threads)", "execution": True},
    )
    max_device_eigh_dim: int = field(
        default=8192,
        metadata={"help": "factors larger than this eigendecomposed on the CPU", "execution": True},
    )
    factor_memory_gb: float = field(
        default=4.0,
        metadata={"help": "GiB of factors a job holds: layers in groups of it", "execution": True},
    )
    seed: int = field(default=0, metadata={"help": "seed of the sampled labels of the true Fisher"})

    def __post_init__(self) -> None:
        self.layers = tuple(self.layers)
        self.exclude_layers = tuple(self.exclude_layers)
        problems = []
        for name, value, allowed in (
            ("method", self.method, METHODS),
            ("fisher", self.fisher, FISHERS),
            ("damping_mode", self.damping_mode, ("relative", "absolute")),
            ("compute_dtype", self.compute_dtype, COMPUTE_DTYPES),
            ("precondition_dtype", self.precondition_dtype, PRECONDITION_DTYPES),
            ("eigh_device", self.eigh_device, ("auto", "cpu")),
        ):
            if value not in allowed:
                problems.append(f"{name}={value!r} must be one of {list(allowed)}")
        if not (isinstance(self.damping, (int, float)) and math.isfinite(self.damping) and self.damping > 0):
            problems.append(
                f"damping={self.damping!r} is refused: it must be a finite number > 0. Without damping "
                "the inverse of a singular curvature (dead units, constant or duplicated features) is "
                "undefined; for near-exact influence use a tiny relative damping such as 1e-8"
            )
        if not (math.isfinite(self.damping_growth) and self.damping_growth > 1):
            problems.append(f"damping_growth={self.damping_growth} must be > 1")
        if self.max_damping_steps < 0:
            problems.append(f"max_damping_steps={self.max_damping_steps} must be >= 0")
        problems += self._size_problems()
        if problems:
            raise ConfigError("influence settings: " + "; ".join(problems) + ". Fix the config.")

    def _size_problems(self) -> list[str]:
        """Batch sizes, counts and memory that are not positive."""
        counts = ("factor_batch_size", "train_batch_size", "query_batch_size", "eigh_workers")
        counts += ("max_device_eigh_dim",)
        problems = [f"{n}={getattr(self, n)} must be >= 1" for n in counts if getattr(self, n) < 1]
        for name in ("query_memory_gb", "factor_memory_gb"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                problems.append(f"{name}={getattr(self, name)} must be a number > 0")
        for name, none in (("eigh_float32_from", "float64"), ("query_gradient_rank", "exact")):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1 (or None: {none})")
        return problems

    def factor_key(self) -> dict:
        """The settings the fitted factors depend on (damping and batch sizes excluded)."""
        keys = ("method", "fisher", "layers", "exclude_layers", "compute_dtype", "seed", "eigh_float32_from")
        out = {k: v for k, v in asdict(self).items() if k in keys}
        out["layers"], out["exclude_layers"] = list(self.layers), list(self.exclude_layers)
        if self.fisher != "true":
            out["seed"] = None  # only the sampled labels use it
        if self.method == "identity":
            out["fisher"] = None
        out["scheme"] = FACTOR_SCHEME
        return out


def influence_settings(settings: Mapping, execution: Mapping | None = None) -> InfluenceSettings:
    """:class:`InfluenceSettings` from a run's influence config.

    Args:
        settings: the keys that change results (method, and as present fisher, layers,
            exclude_layers, seed, damping, damping_mode, precondition_dtype, query_gradient_rank);
            others are ignored.
        execution: batch sizes (factor_batch_size, train_batch_size, query_batch_size),
            query_memory_gb, factor_memory_gb and eigh_workers, which do not change results.
    """
    keys = ("method", "fisher", "seed", "damping", "damping_mode", "precondition_dtype")
    keys += ("query_gradient_rank", "eigh_float32_from")
    kwargs = {k: settings[k] for k in keys if k in settings}
    if kwargs.get("fisher") is True:  # YAML's unquoted true
        kwargs["fisher"] = "true"
    for k in ("layers", "exclude_layers"):
        if k in settings:
            kwargs[k] = tuple(settings[k])
    counts = dict.fromkeys(("factor_batch_size", "train_batch_size", "query_batch_size", "eigh_workers"), int)
    for k, kind in {**counts, "query_memory_gb": float, "factor_memory_gb": float}.items():
        if execution and k in execution:
            kwargs[k] = kind(execution[k])
    return InfluenceSettings(**kwargs)
