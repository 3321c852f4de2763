"""Settings of the linear probes (torch-free: the workflow reads them while planning).

Fields whose metadata says ``execution`` do not change the probes' results on the CPU (threads,
CUDA autocast): the workflow leaves them out of the rules' params. ``batch_size`` is part of the
method (the optimisation's mini-batches) and does change results.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from epochlens.errors import ConfigError


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
    standardize: bool = field(
        default=True, metadata={"help": "z-score features with the fit samples' mean and std"}
    )
    mixed_precision: bool = field(
        default=True,
        metadata={"help": "autocast on CUDA (bfloat16, else float16); ignored elsewhere", "execution": True},
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
        problems = []
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            problems.append(f"seeds={list(self.seeds)} must be distinct and not empty")
        if not 0 <= self.stop_fraction < 1:
            problems.append(f"stop_fraction={self.stop_fraction} must be in [0, 1)")
        if self.max_epochs < 1 or self.patience < 1 or self.batch_size < 1:
            problems.append("max_epochs, patience and batch_size must be >= 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            problems.append(f"cpu_threads={self.cpu_threads} must be >= 1 or None")
        if not (math.isfinite(self.lr) and self.lr > 0) or self.weight_decay < 0:
            problems.append(f"lr={self.lr} must be > 0 and weight_decay={self.weight_decay} >= 0")
        if problems:
            raise ConfigError("probe settings: " + "; ".join(problems) + ". Fix the config.")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        return d
