"""What a probe predicts: one int64 target per sample, -1 where undefined (a softmax probe), or
float targets (N,) / (N, D), NaN rows where undefined (a ridge probe, :mod:`epochlens.probes.ridge`).

A classifier's (:func:`select_targets`):

* ``class``: the position of the label among the active classes (:func:`class_target`);
* ``cohort``: 0 for classes of earlier tasks (old), 1 for the current task's (new) classes;
* ``curvature_q{n}``: the quantile bin (0 .. n-1) of each training sample's curvature
  (:func:`quantile_target`), i.e. can the layer tell high-curvature (memorised) samples apart.

A regression's (:func:`select_regression_targets`):

* ``target``: the regression targets themselves, all D values (float64): the ridge probe;
* ``target_q{n}``: the quantile bin (0 .. n-1) of each sample's :func:`target_scalar` (the target
  for a scalar target, its L2 norm over the D values for a vector target), bin edges from the fit
  samples only, applied to the holdout and test samples;
* ``curvature_q{n}``: as a classifier's (every training sample has a curvature).

A language model's (:func:`select_lm_targets`; no classes):

* ``group``: each sample's data group (``data.text.group_column``: e.g. the prompt set), 0 .. G-1;
* ``curvature_q{n}``: as a classifier's (training samples only: evaluated on the training
  holdout, skipped without one).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from epochlens.errors import ConfigError, ProbeError
from epochlens.models.networks import positions_in
from epochlens.probes.settings import CLASSIFIER_TARGETS, LM_TARGETS, REGRESSION_TARGETS


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


def quantile_target(
    values: np.ndarray, n_bins: int = 4, mask: np.ndarray | None = None, edges: np.ndarray | None = None
) -> np.ndarray:
    """(N,) quantile bin 0 .. n_bins-1 of each finite value; -1 for NaN (or outside ``mask``).

    Bin edges are the quantiles of the finite values inside ``mask`` (default: all), so the bins
    hold equal shares of those samples (ties aside); or ``edges`` (n_bins - 1,) given, e.g.
    :func:`quantile_edges` of the fit samples, applied to every finite value inside ``mask``.
    """
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values) if mask is None else np.isfinite(values) & np.asarray(mask, dtype=bool)
    out = np.full(len(values), -1, dtype=np.int64)
    _check_bins(n_bins)
    if edges is None:
        if not ok.any():
            return out
        edges = quantile_edges(values, n_bins, ok)
    elif len(edges) != n_bins - 1:
        raise ProbeError(f"{len(edges)} bin edges given for {n_bins} bins; give n_bins - 1.")
    out[ok] = np.searchsorted(edges, values[ok], side="right")
    return out


def quantile_edges(values: np.ndarray, n_bins: int, mask: np.ndarray | None = None) -> np.ndarray:
    """(n_bins - 1,) inner quantiles of the finite ``values`` inside ``mask`` (default: all).

    Raises:
        ConfigError: ``n_bins`` < 2.
        ProbeError: no finite value inside ``mask``.
    """
    _check_bins(n_bins)
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values) if mask is None else np.isfinite(values) & np.asarray(mask, dtype=bool)
    if not ok.any():
        raise ProbeError("no finite values to take quantile bin edges from.")
    return np.quantile(values[ok], np.linspace(0, 1, n_bins + 1)[1:-1])


def _check_bins(n_bins: int) -> None:
    if n_bins < 2:
        raise ConfigError(f"n_bins={n_bins} must be >= 2")


def target_scalar(targets: np.ndarray) -> np.ndarray:
    """(N,) float64 scalar of each regression target that ``target_q{n}`` bins: the target itself
    for targets (N,) or (N, 1), the L2 norm of its D values for targets (N, D)."""
    y = np.asarray(targets, dtype=np.float64)
    if y.ndim == 1:
        return y
    if y.ndim != 2:
        raise ProbeError(f"regression targets of shape {y.shape}; expected (N,) or (N, D).")
    return y[:, 0].copy() if y.shape[1] == 1 else np.linalg.norm(y, axis=1)


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
    stray = [t for t in wanted if t not in CLASSIFIER_TARGETS]
    if stray:
        raise ProbeError(
            f"probe targets {stray} are not a classifier's; its targets: {list(CLASSIFIER_TARGETS)}."
        )
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


def _checked_regression_inputs(
    targets: Mapping[str, np.ndarray], wanted: list[str], fit: np.ndarray
) -> np.ndarray:
    """The fit mask as bool, after refusing a classifier's targets, non-float targets, or a fit mask
    of another length than the train split (:func:`select_regression_targets`)."""
    stray = [t for t in wanted if t not in REGRESSION_TARGETS]
    if stray:
        raise ProbeError(
            f"probe targets {stray} are not a regression's (it has no classes); its targets: "
            f"{list(REGRESSION_TARGETS)}."
        )
    fit = np.asarray(fit, dtype=bool)
    for split, y in targets.items():
        if not np.issubdtype(np.asarray(y).dtype, np.floating):
            raise ProbeError(
                f"the {split} targets are {np.asarray(y).dtype}: a regression's probes need its float "
                "targets (from dataset.h5), not class ids."
            )
    if "train" not in targets or len(fit) != len(targets["train"]):
        raise ProbeError(f"fit mask of {len(fit)} entries for {len(targets.get('train', []))} train targets.")
    return fit


def select_regression_targets(
    targets: Mapping[str, np.ndarray],
    wanted: list[str],
    curvature: np.ndarray | None,
    curvature_bins: int,
    target_bins: int,
    fit: np.ndarray,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
    """A regression's probe targets of the config's ``probes.targets``, and why others are skipped.

    Args:
        targets: regression targets per split, ``{"train": (N,) or (N, D), "test": ...}`` (floats).
        wanted: the config's targets (target, target_quantile, curvature).
        curvature: (N_train,) per-sample curvature at this epoch, or None where not computed.
        curvature_bins, target_bins: quantile bins of the curvature and target_quantile targets.
        fit: (N_train,) bool, the training samples probes are fitted on (target bins come from them).

    Returns:
        ``(targets, skipped)``: ``target`` float64 (N_split,) or (N_split, D) per split;
        ``target_q{bins}`` and ``curvature_q{bins}`` int64 per split (curvature: train only), as
        :func:`select_targets`; ``{target: reason}`` for targets that cannot be probed here.

    Raises:
        ProbeError: targets that are not floats, or curvature of another length than the train split.
    """
    fit = _checked_regression_inputs(targets, wanted, fit)
    out: dict[str, dict[str, np.ndarray]] = {}
    skipped: dict[str, str] = {}
    if "target" in wanted:
        out["target"] = {s: np.asarray(y, dtype=np.float64) for s, y in targets.items()}
    if "target_quantile" in wanted:
        scalars = {s: target_scalar(y) for s, y in targets.items()}
        name = f"target_q{target_bins}"
        if np.isfinite(scalars["train"][fit]).any():
            edges = quantile_edges(scalars["train"], target_bins, fit)
            out[name] = {s: quantile_target(v, target_bins, edges=edges) for s, v in scalars.items()}
        else:
            skipped[name] = "skipped: no fit samples"
    if "curvature" in wanted:
        name = f"curvature_q{curvature_bins}"
        if curvature is None:
            skipped[name] = "skipped: curvature not computed at this epoch"
        elif len(curvature) != len(targets["train"]):
            raise ProbeError(
                f"curvature has {len(curvature)} values; it must have one per training sample "
                f"({len(targets['train'])})."
            )
        else:
            out[name] = {"train": quantile_target(curvature, curvature_bins)}
    for name in list(out):
        y = out[name]["train"][fit]
        if name == "target":
            few = len(y) < 2 or not np.any(np.ptp(y.reshape(len(y), -1), axis=0) > 0)
            why = "skipped: fewer than two fit samples, or targets constant on them"
        else:
            few = len(np.unique(y[y >= 0])) < 2
            why = "skipped: fewer than two target values among the fit samples"
        if few:
            skipped[name] = why
            del out[name]
    return out, skipped


def select_lm_targets(
    groups: Mapping[str, np.ndarray] | None,
    wanted: list[str],
    curvature: np.ndarray | None,
    curvature_bins: int,
    fit: np.ndarray,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
    """A language model's probe targets of the config's ``probes.targets``, and why others are skipped.

    Args:
        groups: each sample's data group per split, ``{"train": (N,), "test": (N_test,)}`` int64
            (-1: none), or None when the data has no groups.
        wanted: the config's targets (group, curvature).
        curvature: (N_train,) per-sample curvature at this epoch, or None where not computed.
        curvature_bins: quantile bins of the curvature target.
        fit: (N_train,) bool, the training samples probes are fitted on.

    Returns:
        ``(targets, skipped)`` as :func:`select_targets`.
    """
    stray = [t for t in wanted if t not in LM_TARGETS]
    if stray:
        raise ProbeError(
            f"probe targets {stray} are not a language model's (it has no classes); its targets: "
            f"{list(LM_TARGETS)}."
        )
    out: dict[str, dict[str, np.ndarray]] = {}
    skipped: dict[str, str] = {}
    if "group" in wanted:
        if groups is None:
            skipped["group"] = "skipped: the data has no groups (data.text.group_column)"
        else:
            out["group"] = {s: np.asarray(g, dtype=np.int64) for s, g in groups.items()}
    if "curvature" in wanted:
        name = f"curvature_q{curvature_bins}"
        if curvature is None:
            skipped[name] = "skipped: curvature not computed at this epoch"
        elif np.asarray(fit, dtype=bool).all():  # a train-only target: evaluated on the holdout
            skipped[name] = "skipped: the data has no training holdout to evaluate it on"
        else:
            if len(curvature) != len(fit):
                raise ProbeError(
                    f"curvature has {len(curvature)} values; it must have one per training sample "
                    f"({len(fit)})."
                )
            out[name] = {"train": quantile_target(curvature, curvature_bins)}
    for name in list(out):
        y = out[name]["train"][np.asarray(fit, dtype=bool)]
        if len(np.unique(y[y >= 0])) < 2:
            skipped[name] = "skipped: fewer than two target values among the fit samples"
            del out[name]
    return out, skipped
