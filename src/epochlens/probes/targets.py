"""What a probe predicts: one int64 target per sample, -1 where undefined.

* ``class``: the position of the label among the active classes (:func:`class_target`);
* ``cohort``: 0 for classes of earlier tasks (old), 1 for the current task's (new) classes;
* ``curvature_q{n}``: the quantile bin (0 .. n-1) of each training sample's curvature
  (:func:`quantile_target`), i.e. can the layer tell high-curvature (memorised) samples apart.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from epochlens.errors import ConfigError, ProbeError
from epochlens.models.networks import positions_in


def class_target(labels: np.ndarray, active_classes: np.ndarray) -> np.ndarray:
    """(N,) position of each label among ``active_classes``; -1 for inactive classes."""
    return positions_in(np.asarray(labels, dtype=np.int64), np.asarray(active_classes, dtype=np.int64))


def cohort_target(labels: np.ndarray, active_classes: np.ndarray, new_classes: np.ndarray) -> np.ndarray:
    """(N,) 0 for old classes (active, not new), 1 for new classes, -1 for inactive classes.

    Raises:
        ConfigError: ``new_classes`` not a subset of ``active_classes``.
    """
    labels, active, new = (np.asarray(a, dtype=np.int64) for a in (labels, active_classes, new_classes))
    stray = np.setdiff1d(new, active)
    if len(stray):
        raise ConfigError(f"new classes {stray.tolist()} are not active classes {active.tolist()}")
    out = np.full(len(labels), -1, dtype=np.int64)
    out[np.isin(labels, active)] = 0
    out[np.isin(labels, new)] = 1
    return out


def quantile_target(values: np.ndarray, n_bins: int = 4, mask: np.ndarray | None = None) -> np.ndarray:
    """(N,) quantile bin 0 .. n_bins-1 of each finite value; -1 for NaN (or outside ``mask``).

    Bin edges are the quantiles of the finite values inside ``mask`` (default: all), so the bins
    hold equal shares of those samples (ties aside).
    """
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values) if mask is None else np.isfinite(values) & np.asarray(mask, dtype=bool)
    out = np.full(len(values), -1, dtype=np.int64)
    if n_bins < 2:
        raise ConfigError(f"n_bins={n_bins} must be >= 2")
    if not ok.any():
        return out
    edges = np.quantile(values[ok], np.linspace(0, 1, n_bins + 1)[1:-1])
    out[ok] = np.searchsorted(edges, values[ok], side="right")
    return out


def standard_targets(
    labels: Mapping[str, np.ndarray],
    active_classes: np.ndarray,
    new_classes: np.ndarray | None = None,
    curvature: np.ndarray | None = None,
    curvature_bins: int = 4,
) -> dict[str, dict[str, np.ndarray]]:
    """The standard targets of one epoch: ``targets[name][split]`` (N_split,) int64, -1 = undefined.

    Args:
        labels: class labels per split, e.g. ``{"train": ..., "test": ...}``.
        active_classes: classes trained at this epoch (class-order position = class target).
        new_classes: the current task's classes (cohort target; skipped if None or if there are
            no old classes, as in the first task).
        curvature: (N_train,) per-sample curvature of the training split (NaN for inactive
            classes); gives ``curvature_q{bins}`` on the train split only.
    """
    targets = {"class": {s: class_target(y, active_classes) for s, y in labels.items()}}
    if new_classes is not None and len(np.setdiff1d(active_classes, new_classes)) > 0:
        targets["cohort"] = {s: cohort_target(y, active_classes, new_classes) for s, y in labels.items()}
    if curvature is not None:
        if "train" not in labels or len(curvature) != len(labels["train"]):
            raise ProbeError(
                f"curvature has {len(curvature)} values; it must have one per training sample "
                f"({len(labels.get('train', []))})."
            )
        targets[f"curvature_q{curvature_bins}"] = {"train": quantile_target(curvature, curvature_bins)}
    return targets


def select_targets(
    labels: Mapping[str, np.ndarray],
    active_classes: np.ndarray,
    new_classes: np.ndarray,
    wanted: list[str],
    curvature: np.ndarray | None,
    curvature_bins: int,
    fit: np.ndarray,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
    """The targets of the config's ``probes.targets`` that can be probed at a checkpoint, and why
    the others are skipped.

    Args:
        labels: ``labels[split]`` of the features file.
        active_classes, new_classes: the checkpoint's classes and its newest task's.
        wanted: the config's targets (class, cohort, curvature).
        curvature: (N_train,) per-image curvature at this epoch, or None where not computed.
        curvature_bins: quantile bins of the curvature target.
        fit: (N_train,) bool, the training images probes are fitted on.

    Returns:
        ``(targets, skipped)``: :func:`standard_targets` restricted to ``wanted`` and to targets
        with two values or more among the fit images; ``{target: reason}`` for the rest.
    """
    targets = standard_targets(
        labels, active_classes, new_classes if "cohort" in wanted else None, curvature, curvature_bins
    )
    skipped = {}
    if "class" not in wanted:
        del targets["class"]
    if "cohort" in wanted and "cohort" not in targets:
        skipped["cohort"] = "skipped: no old classes yet (first task)"
    if "curvature" in wanted and curvature is None:
        skipped[f"curvature_q{curvature_bins}"] = "skipped: curvature not computed at this epoch"
    for name in list(targets):
        y = targets[name]["train"][fit]
        if len(np.unique(y[y >= 0])) < 2:
            skipped[name] = "skipped: fewer than two target values among the fit images"
            del targets[name]
    return targets, skipped
