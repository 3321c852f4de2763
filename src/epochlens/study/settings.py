"""Settings of the data-quality study around the influence engine (torch-free: the workflow reads
them while planning): which test images are attributed (:class:`QuerySettings`) and under which
query transforms (:class:`QueryTransformSettings`, :mod:`epochlens.study.transforms`).

Field metadata: ``tables`` marks a setting that changes only the run's tables (how scores are
reduced, how many top images are listed), not the scores: the scores' params leave it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from epochlens.errors import ConfigError

QUERY_SELECTIONS = ("misclassified", "all", "highest_loss")
QUERY_LABELS = ("predicted", "correct")
QUERY_REDUCTIONS = ("max", "mean")
IMAGE_QUERY_TRANSFORMS = ("hflip", "noise", "crop")
TEXT_QUERY_TRANSFORMS = ("token_dropout", "truncate")
QUERY_TRANSFORMS = ("none", *IMAGE_QUERY_TRANSFORMS, *TEXT_QUERY_TRANSFORMS)


@dataclass
class QuerySettings:
    """The test images whose predictions are attributed to training images (``influence.queries``)."""

    select: Literal["misclassified", "all", "highest_loss"] = field(
        default="misclassified",
        metadata={
            "help": "test images of the active classes the checkpoint gets wrong, or all of them; a "
            "regression: all, or highest_loss (the max_count test samples with the largest loss)"
        },
    )
    max_count: int = field(default=50, metadata={"help": "at most this many queries (a seeded subset)"})
    labels: Literal["correct", "predicted"] = field(
        default="correct", metadata={"help": "the label whose loss a query measures"}
    )
    reduce: Literal["max", "mean"] = field(
        default="max",
        metadata={"help": "per training image, over the queries: max or mean", "tables": True},
    )
    trigger: bool | None = field(
        default=None,
        metadata={"help": "stamp data.corruption's trigger on the queries; None: when it is a trigger"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the subset"})

    def __post_init__(self) -> None:
        problems = []
        for name, value, allowed in (
            ("select", self.select, QUERY_SELECTIONS),
            ("labels", self.labels, QUERY_LABELS),
            ("reduce", self.reduce, QUERY_REDUCTIONS),
        ):
            if value not in allowed:
                problems.append(f"{name}={value!r} must be one of {list(allowed)}")
        if self.max_count < 1:
            problems.append(f"max_count={self.max_count} must be >= 1")
        if problems:
            raise ConfigError("influence.queries: " + "; ".join(problems) + ". Fix the config.")


@dataclass
class QueryTransformSettings:
    """Query transforms scored separately, and their parameters."""

    transforms: tuple[str, ...] = field(
        default=("none",), metadata={"help": f"any of {list(QUERY_TRANSFORMS)}"}
    )
    noise_std: float = field(default=0.1, metadata={"help": "noise transform: std in normalised units"})
    crop_pad: int = field(default=1, metadata={"help": "crop transform: largest shift in pixels"})
    drop_fraction: float = field(
        default=0.1, metadata={"help": "token_dropout transform: probability of dropping each inner token"}
    )
    keep_fraction: float = field(
        default=0.5, metadata={"help": "truncate transform: fraction of the inner tokens kept"}
    )
    transform_seed: int = field(
        default=0, metadata={"help": "seed of the noise, crop and token_dropout transforms"}
    )
    top_k: int = field(
        default=16,
        metadata={"help": "top-ranked training images kept per signal (table and figure)", "tables": True},
    )

    def __post_init__(self) -> None:
        self.transforms = tuple(self.transforms)
        unknown = [t for t in self.transforms if t not in QUERY_TRANSFORMS]
        if unknown or not self.transforms:
            raise ConfigError(
                f"influence.transforms: {list(self.transforms)} must be values of {list(QUERY_TRANSFORMS)}."
            )
        if not 0 <= self.drop_fraction < 1 or not 0 < self.keep_fraction <= 1:
            raise ConfigError(
                f"influence.drop_fraction={self.drop_fraction} must be in [0, 1) and influence."
                f"keep_fraction={self.keep_fraction} in (0, 1]."
            )
