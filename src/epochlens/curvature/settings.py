"""Settings of the curvature estimator (torch-free: the workflow reads them while planning).

Fields whose metadata says ``execution`` change how the work is done, not the results (batch
sizes): the workflow leaves them out of the rules' params, so changing them reruns nothing
(:func:`epochlens.config.results.result_settings`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from epochlens.errors import ConfigError

#: Identifies how directions are derived from (seed, index); stored in metadata so a change of
#: scheme is never mistaken for the same estimator.
DIRECTION_SCHEME = "splitmix64-rademacher-v1"


@dataclass
class CurvatureSettings:
    """How the curvature is estimated (every field is recorded in the results' metadata)."""

    h: float = field(default=1e-3, metadata={"help": "finite-difference step (input units)"})
    n_directions: int = field(
        default=10, metadata={"help": "Rademacher directions per sample (n in the formulas)"}
    )
    temperature: float = field(
        default=1.0, metadata={"help": "logits are divided by T before the cross-entropy"}
    )
    norm: Literal["l2", "l2_squared"] = field(
        default="l2", metadata={"help": "curvature averages ‖Δg‖₂ (l2) or ‖Δg‖₂² (l2_squared)"}
    )
    mode: Literal["finite_difference", "exact"] = field(
        default="finite_difference",
        metadata={"help": "Δg = g(x+hv) − g(x), or exact: Δg = h·H v by Hessian-vector product"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the directions (with sample index)"})
    tolerance: float = field(
        default=0.1,
        metadata={
            "help": "regression: a sample counts as learned (correct) when its loss is at most "
            "tolerance x the mean loss of predicting the training targets' mean"
        },
    )
    reduction: Literal["mean", "sum"] = field(
        default="mean",
        metadata={
            "help": "regression: the squared error's mean or sum over a sample's values (the run's task)"
        },
    )
    batch_size: int = field(
        default=128,
        metadata={"help": "samples per batch (one device-to-host copy per batch)", "execution": True},
    )
    max_batch: int | None = field(
        default=None,
        metadata={
            "help": "most rows (sample-direction pairs) per forward/backward; bounds memory. "
            "None: ~1.3e5 input elements on CPU (cache-friendly), ~2e6 on GPUs",
            "execution": True,
        },
    )

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.h) and self.h > 0):
            problems.append(f"h={self.h} must be a positive number")
        if self.n_directions < 1:
            problems.append(f"n_directions={self.n_directions} must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            problems.append(f"temperature={self.temperature} must be a positive number")
        if self.norm not in ("l2", "l2_squared"):
            problems.append(f"norm={self.norm!r} must be 'l2' or 'l2_squared'")
        if self.mode not in ("finite_difference", "exact"):
            problems.append(f"mode={self.mode!r} must be 'finite_difference' or 'exact'")
        if not (math.isfinite(self.tolerance) and self.tolerance > 0):
            problems.append(f"tolerance={self.tolerance} must be a positive number")
        if self.reduction not in ("mean", "sum"):
            problems.append(f"reduction={self.reduction!r} must be 'mean' or 'sum'")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if self.max_batch is not None and self.max_batch < 1:
            problems.append(f"max_batch={self.max_batch} must be >= 1 or None")
        if problems:
            raise ConfigError("curvature settings: " + "; ".join(problems) + ". Fix the config.")

    def estimator_metadata(self) -> dict:
        """What a result depends on, for ``metadata.json`` (batch sizes excluded: they do not)."""
        meta = asdict(self)
        # batch sizes change no result; the regression fields are in a regression's own header
        for key in ("batch_size", "max_batch", "tolerance", "reduction"):
            del meta[key]
        delta = "h*H(x)v_i" if self.mode == "exact" else "g(x+h*v_i)-g(x)"
        power = "^2" if self.norm == "l2_squared" else ""
        meta.update(
            formula_curvature=f"mean_i ||{delta}||_2{power}",
            formula_directional_eig=f"mean_i (h*v_i).({delta})",
            gradient="g(x)=d/dx CE(f(x)[active]/T, position of y in active), model in eval mode",
            directions=DIRECTION_SCHEME,
        )
        return meta
