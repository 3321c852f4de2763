"""Settings of the linear probes (torch-free: the workflow reads them while planning).

Fields whose metadata says ``execution`` do not change the probes' results on the CPU (threads,
CUDA autocast): the workflow leaves them out of the rules' params. ``batch_size`` is part of the
method (the optimisation's mini-batches) and does change results.

Targets by kind of run (:func:`probe_targets`): a classifier's are ``class``, ``cohort`` and
``curvature``; a regression's ``target`` (the ridge probe, scored by R²), ``target_quantile``
(quantile bin of the target) and ``curvature``; a language model's (no classes: a prompt and its
target tokens) ``group`` (each sample's data group, ``data.text.group_column``) and ``curvature``.
``probes.targets: null`` (the default) takes the run's kind's list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from epochlens.errors import ConfigError

#: Probe targets of a classifier (``probes.targets``), by config name.
CLASSIFIER_TARGETS = ("class", "cohort", "curvature")
#: Probe targets of a regression: the ridge probe of the targets, their quantile bin, curvature.
REGRESSION_TARGETS = ("target", "target_quantile", "curvature")
#: Probe targets of a language model: each sample's data group, and curvature.
LM_TARGETS = ("group", "curvature")
#: Default penalties of the ridge probe: alpha per fit sample on standardised features, i.e.
#: scikit-learn's ``Ridge(alpha=alpha * n_fit)``; the best on the early-stopping samples is kept.
RIDGE_ALPHAS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)

#: Probes of class targets (``probes.kind``): softmax regression, or the closed-form ridge probe.
PROBE_KINDS = ("softmax", "ridge")
RIDGE_DTYPES = ("float64", "float32")
#: Mini-batch orders of the softmax probes (``probes.batch_order``): each seed its own, or one
#: order that every seed of a layer shares (:mod:`epochlens.probes.shared_order`).
BATCH_ORDERS = ("per_seed", "shared")


def probe_targets(targets: Sequence[str] | None, regression: bool, lm: bool = False) -> list[str]:
    """The targets a run probes: ``targets`` as configured, or (None) every target of its kind
    (``lm``: a language model's)."""
    if targets is None:
        return list(LM_TARGETS if lm else REGRESSION_TARGETS if regression else CLASSIFIER_TARGETS)
    return list(targets)


def target_problem(targets: Sequence[str] | None, regression: bool, lm: bool = False) -> str | None:
    """Why ``targets`` do not fit a run of this kind (a sentence with the fix), or None."""
    if targets is None:
        return None
    if lm:
        wrong = [t for t in targets if t not in LM_TARGETS]
        if not wrong:
            return None
        return (
            f"{wrong} are a classifier's or a regression's targets; a language model's are "
            f"{list(LM_TARGETS)} (each prompt's data group, data.text.group_column, and curvature). "
            f"Set probes.targets: {[t for t in targets if t in LM_TARGETS] or list(LM_TARGETS)}, or "
            "leave it out."
        )
    own, other = (
        (REGRESSION_TARGETS, CLASSIFIER_TARGETS) if regression else (CLASSIFIER_TARGETS, REGRESSION_TARGETS)
    )
    wrong = [t for t in targets if t not in own]
    if not wrong:
        return None
    if regression:
        why = (
            f"{wrong} are a classifier's targets (class labels, old vs new classes); a regression has no "
            "classes. Its targets: target (ridge regression of the targets, R²), target_quantile "
            "(quantile bin of the target) and curvature"
        )
    else:
        why = (
            f"{wrong} are a regression's targets (float targets); a classifier's are class, cohort "
            "and curvature"
        )
    analog = dict(zip(other, own, strict=True))  # class ~ target, cohort ~ target_quantile, curvature
    keep = list(dict.fromkeys(analog.get(t, t) for t in targets))
    return (
        f"{why}. Set probes.targets: {keep}, or leave it out (the default: every target of the run's kind)."
    )


@dataclass
class ProbeSettings:
    """How linear probes are trained (all fields are recorded with the results)."""

    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"help": "one probe per seed (early-stopping subset, batch order)"}
    )
    stop_fraction: float = field(
        default=0.15,
        metadata={"help": "share of the fit samples held out per seed for early stopping (0: none)"},
    )
    max_epochs: int = field(default=200, metadata={"help": "most passes over the fit samples"})
    patience: int = field(
        default=10, metadata={"help": "stop after this many epochs without a lower early-stopping loss"}
    )
    min_delta: float = field(default=1e-4, metadata={"help": "smallest loss decrease that counts (nats)"})
    lr: float = field(default=1e-2, metadata={"help": "Adam learning rate"})
    weight_decay: float = field(
        default=1e-4, metadata={"help": "L2 penalty: 0.5 * weight_decay * ||W||² added to the loss"}
    )
    batch_size: int = field(default=512, metadata={"help": "samples per optimisation step"})
    batch_order: str = field(
        default="per_seed",
        metadata={
            "help": "mini-batches of the softmax probes: per_seed (each seed its own order, as one "
            "at a time) or shared (every seed of a layer the same batches of the union of their fit "
            "samples, each seed weighting only its own: one product for all seeds, several times "
            "faster on wide features; seeds then differ by their split only; "
            "epochlens.probes.shared_order)"
        },
    )
    standardize: bool = field(
        default=True, metadata={"help": "z-score features with the fit samples' mean and std"}
    )
    mixed_precision: bool = field(
        default=True,
        metadata={"help": "autocast on CUDA (bfloat16, else float16); ignored elsewhere", "execution": True},
    )
    ridge_alphas: tuple[float, ...] = field(
        default=RIDGE_ALPHAS,
        metadata={
            "help": "penalties of the ridge probe (a regression's target): alpha per fit sample on "
            "standardised features (scikit-learn's Ridge(alpha=alpha * n_fit)); the one with the best "
            "R² on the early-stopping samples is kept"
        },
    )
    kind: str = field(
        default="softmax",
        metadata={
            "help": "probe of class targets: softmax (Adam, early stopping) or ridge (closed form, "
            "scikit-learn's RidgeClassifier, penalty among ridge_alphas chosen by accuracy on the "
            "early-stopping samples; epochlens.probes.ridge_classes)"
        },
    )
    ridge_dtype: str = field(
        default="float64",
        metadata={"help": "precision of the ridge probe of classes: float64 or float32 (faster)"},
    )
    batch_layers: int = field(
        default=16,
        metadata={
            "help": "softmax probes of this many layers (of one width) and every seed fitted together "
            "(the same algorithm as one at a time, equal up to rounding); 1: one probe at a time "
            "(batch_order shared: one layer's seeds at a time)",
            "execution": True,
        },
    )
    batched_threads: int | None = field(
        default=1,
        metadata={
            "help": "torch intra-op threads of the batched fits on the CPU (one was fastest on a shared "
            "2-core CPU); None: leave torch's setting",
            "execution": True,
        },
    )
    cpu_threads: int | None = field(
        default=1,
        metadata={
            "help": "torch intra-op threads while probing on the CPU (restored afterwards); the small "
            "matrix products of a probe run fastest on one thread. None: leave torch's setting",
            "execution": True,
        },
    )

    def __post_init__(self) -> None:
        self.seeds = tuple(int(s) for s in self.seeds)
        self.ridge_alphas = tuple(float(a) for a in self.ridge_alphas)
        problems = []
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            problems.append(f"seeds={list(self.seeds)} must be distinct and not empty")
        if not 0 <= self.stop_fraction < 1:
            problems.append(f"stop_fraction={self.stop_fraction} must be in [0, 1)")
        if self.max_epochs < 1 or self.patience < 1 or self.batch_size < 1 or self.batch_layers < 1:
            problems.append("max_epochs, patience, batch_size and batch_layers must be >= 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            problems.append(f"cpu_threads={self.cpu_threads} must be >= 1 or None")
        if not (math.isfinite(self.lr) and self.lr > 0) or self.weight_decay < 0:
            problems.append(f"lr={self.lr} must be > 0 and weight_decay={self.weight_decay} >= 0")
        if not self.ridge_alphas or not all(math.isfinite(a) and a > 0 for a in self.ridge_alphas):
            problems.append(f"ridge_alphas={list(self.ridge_alphas)} must be finite, > 0 and not empty")
        if self.kind not in PROBE_KINDS:
            problems.append(f"kind={self.kind!r} must be one of {list(PROBE_KINDS)}")
        if self.batch_order not in BATCH_ORDERS:
            problems.append(f"batch_order={self.batch_order!r} must be one of {list(BATCH_ORDERS)}")
        if self.ridge_dtype not in RIDGE_DTYPES:
            problems.append(f"ridge_dtype={self.ridge_dtype!r} must be one of {list(RIDGE_DTYPES)}")
        if problems:
            raise ConfigError("probe settings: " + "; ".join(problems) + ". Fix the config.")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        d["ridge_alphas"] = list(self.ridge_alphas)
        return d
