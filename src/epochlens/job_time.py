"""The wall time each job asks for (Snakemake's ``runtime``, minutes), from the shapes of its run.

The rules that pass a model over the data set (evaluation, sample outputs, curvature, features,
ablations, influence) take a fixed start (the interpreter, torch, the model read) plus, for each
sample of their share of the data set and each checkpoint they pass over, some forward passes'
worth of work. :data:`RULES` gives each rule those numbers, measured with ``benchmarks/scale.py``
on the small CNN on a CPU (the slope of each job's seconds between two sizes of the data set; see
docs/measurements.md); a forward pass costs :data:`FORWARD_MS` per sample plus
:data:`FORWARD_MS_PER_MODEL_MB` per MB of the model's weights (the loss-of-plasticity study's
ResNet-18, 45 MB, took 0.6 ms a CIFAR image on two CPU cores, the small CNN 0.01 ms). A job given
a GPU takes less than this CPU estimate: the request is an upper bound, x :data:`HEADROOM`, x the
attempt, at least :data:`MIN_MINUTES` and at most :data:`MAX_MINUTES` (a partition holds back a job
that asks for more than its time limit). A shard job (``nshards`` among its wildcards) counts its
share of the samples.

The workflow declares ``runtime`` through :func:`job_runtime` for these rules (rules/common.smk:
``get_runtime``); the others get the profile's ``default-resources``, and a profile's
``set-resources: <rule>: {runtime: ...}`` still wins. No job imports this module: changing a number
reruns nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epochlens.memory import MB, RunShape, job_shape, shard_share

HEADROOM = 2.0
MIN_MINUTES = 15
#: A day: longer jobs are split with the rule's shards (curvature, influence, sample outputs) or
#: given their time in the profile.
MAX_MINUTES = 24 * 60
#: The GPU jobs' fixed time before this module (4 h x attempt), for the rules it does not size.
FALLBACK_MINUTES = 240
FORWARD_MS = 0.01
FORWARD_MS_PER_MODEL_MB = 0.013


@dataclass(frozen=True)
class Time:
    """A rule's seconds: ``base_s`` + samples x checkpoints x ``passes`` forward passes."""

    base_s: float = 60
    passes: float = 1.0

    def seconds(self, shape: RunShape, checkpoints: int = 1, share: float = 1.0) -> float:
        """The expected seconds of a job of this rule over ``share`` of ``shape``'s samples."""
        forward_ms = FORWARD_MS + FORWARD_MS_PER_MODEL_MB * shape.model_bytes / MB
        return self.base_s + shape.samples * share * checkpoints * self.passes * forward_ms / 1000


#: Forward passes per sample and checkpoint: each rule's seconds per added sample between 5,000 and
#: 20,000 CIFAR-shaped training images (``benchmarks/scale.py --sizes 5000 20000 --stages all
#: --model small_cnn``, every job's ``benchmark:`` seconds, the machine shared with tests: upper
#: bounds) over the small CNN's forward pass. Curvature's 39 are its Hutchinson directions' double
#: backward passes; the features' 160 their per-sample spectra, not the model. Influence's
#: eigendecomposition grows with the model's layers, not the samples: it keeps
#: :data:`FALLBACK_MINUTES`, as does a retraining (its recipe's epochs).
RULES: dict[str, Time] = {
    "evaluate_checkpoint": Time(passes=8),
    "sample_outputs_shard": Time(passes=14),
    "curvature_shard": Time(passes=39),
    "features_epoch": Time(passes=160),
    "ablation_epoch": Time(passes=41),
    "ablation_part": Time(passes=41),  # at most: a part makes its share of the passes
    "influence_factors": Time(passes=47),
    "influence_covariances": Time(passes=24),
    "influence_corrections": Time(passes=24),
    "influence_scores": Time(passes=44),
    "influence_score_shard": Time(passes=44),
    "influence_store_shard": Time(passes=24),  # a loss and a Fisher backward a sample
    # one read of the store: a sixth of the store's time for 1,000 queries (a million samples)
    "influence_store_scores": Time(passes=4),
}


def minutes(rule: str, shape: RunShape, checkpoints: int = 1, share: float = 1.0, attempt: int = 1) -> int:
    """What a job of ``rule`` asks for (minutes) at its ``attempt``; :data:`FALLBACK_MINUTES` x the
    attempt for a rule not in :data:`RULES` (a retraining's time is its recipe's, not a pass's)."""
    if rule not in RULES:
        return min(MAX_MINUTES, FALLBACK_MINUTES * max(1, attempt))
    seconds = RULES[rule].seconds(shape, checkpoints, share) * HEADROOM
    return min(MAX_MINUTES, max(MIN_MINUTES, math.ceil(seconds / 60)) * max(1, attempt))


def job_runtime(rule: str, inputs: Mapping[str, Any], wildcards: Any, attempt: int = 1) -> int:
    """``runtime`` of a job of ``rule`` with these named inputs and wildcards (attributes, as
    Snakemake's) at its ``attempt``: its checkpoints (``checkpoints``, or one) and its shard's
    share of the samples."""
    checkpoints = inputs.get("checkpoints")
    count = 1 if checkpoints is None or isinstance(checkpoints, str) else max(1, len(checkpoints))
    return minutes(rule, job_shape(inputs), count, shard_share(wildcards), attempt)


def describe(rule: str) -> str:
    """``rule``'s time as a formula (seconds, before the headroom); empty for a fixed fall-back."""
    if rule not in RULES:
        return f"{FALLBACK_MINUTES} min"
    t = RULES[rule]
    forward = f"({FORWARD_MS:g} ms + {FORWARD_MS_PER_MODEL_MB:g} ms x model MB)"
    return f"{t.base_s:g} s + {t.passes:g} x {forward} x samples x checkpoints"
