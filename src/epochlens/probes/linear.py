"""Linear probes on cached features: can a layer's representation predict a target?

A probe is a softmax regression (one linear layer) on standardised features, trained with Adam and
stopped early, one seed at a time (:mod:`epochlens.probes.softmax`) or several seeds and layers at
once (:mod:`epochlens.probes.batched`).

Splits (from the data's holdout, see ``epochlens.data.dataset.holdout_mask``):

* fit: training samples outside the holdout, less a per-seed random ``stop_fraction`` of them
  (stratified by target), on which the loss decides early stopping;
* evaluation: ``holdout``, the training holdout (the loss-of-plasticity validation images), and
  ``test``, the test split, wherever the target is defined there. The holdout is the primary
  evaluation split: per-sample curvature exists for training images only, so the curvature
  target has no test rows.

Targets (arrays with -1 where undefined; such samples are left out of fitting and evaluation):

* ``class``: the position of the label among the active classes (:func:`class_target`);
* ``cohort``: 0 for classes of earlier tasks (old), 1 for the current task's (new) classes;
* ``curvature_q{n}``, ``target_q{n}``: the quantile bin (0 .. n-1) of each training sample's
  curvature, or of a regression's target (:mod:`epochlens.probes.targets`);
* a float target (a regression's ``target``, (N,) or (N, D), NaN rows where undefined) is probed
  by the closed-form ridge probe of :mod:`epochlens.probes.ridge` instead, scored by R².

Tidy output (:func:`probe_features`), one row per (layer, representation, target, seed, eval
split), with any context columns (e.g. epoch) first: layer, representation, target, seed,
eval_split, n_features, n_classes, n_fit, n_stop, n_eval, accuracy, loss, chance, fit_accuracy,
best_epoch, epochs_run, metric; and where a ridge probe ran, n_outputs, r2, fit_r2 and alpha
(:data:`ROW_COLUMNS`). ``metric`` names the row's score: ``accuracy`` (softmax probe: ``loss`` the
mean cross-entropy in nats, ``chance`` the accuracy of always predicting the most frequent class of
the fit set) or ``r2`` (ridge probe: score in ``r2``, never in ``accuracy``; ``loss`` the mean
squared error, ``chance`` the R² of predicting the fit targets' mean, about 0).
:func:`epochlens.probes.summary.aggregate_seeds` reduces the seeds to mean, standard deviation and
a 95% t-interval half-width.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from epochlens.device import resolve_device
from epochlens.errors import ProbeError
from epochlens.probes.plan import ProbePlan, probe_plan, stratified_split  # noqa: F401 (public here too)
from epochlens.probes.ridge import ridge_seeds
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.softmax import ProbeFit, amp_mode, cpu_threads, probe_seeds, train_linear_probe  # noqa: F401 (moved there; importable here too)
from epochlens.progress import progress_bar

log = logging.getLogger("epochlens")

#: Columns of a probe table after the context columns (those of a ridge probe last; a table
#: without ridge rows has none of them).
ROW_COLUMNS = (
    "layer",
    "representation",
    "target",
    "seed",
    "eval_split",
    "n_features",
    "n_classes",
    "n_fit",
    "n_stop",
    "n_eval",
    "accuracy",
    "loss",
    "chance",
    "fit_accuracy",
    "best_epoch",
    "epochs_run",
    "status",
    "metric",
    "n_outputs",
    "r2",
    "fit_r2",
    "alpha",
)
RIDGE_ONLY_COLUMNS = ("n_outputs", "r2", "fit_r2", "alpha")
#: Most bytes of features (float32) that one batched fit of several layers holds on its device.
BATCHED_BYTES = 512 << 20


def probe_features(
    features: object,
    targets: Mapping[str, Mapping[str, np.ndarray]],
    holdout: np.ndarray,
    settings: ProbeSettings | None = None,
    layers: Sequence[str] | None = None,
    representations: Sequence[str] | None = None,
    context: Mapping[str, object] | None = None,
    device: torch.device | str | None = "auto",
    progress: bool = False,
) -> pd.DataFrame:
    """Probes for every (layer, representation, target) of a features file: a tidy DataFrame.

    Args:
        features: a :class:`epochlens.features.extract.FeatureSet` (anything with ``layers``,
            ``representations``, ``splits`` and ``array(split, layer, representation)``).
        targets: ``targets[name][split]`` (N_split,) int64, -1 where undefined (see
            :func:`standard_targets`): a softmax probe; or float (N_split,) / (N_split, D), NaN rows
            where undefined: a ridge probe (:mod:`epochlens.probes.ridge`). Splits missing for a
            target are not used.
        holdout: (N_train,) bool, the training holdout (evaluation, never fitted).
        settings: probe settings.
        layers, representations: subsets to probe (default: all in the file).
        context: constant columns put first in every row (e.g. ``{"epoch": 200}``).
        device: where features and probes live ("auto": CUDA, then MPS, then CPU).
        progress: progress bar over (layer, representation) pairs.

    Returns:
        DataFrame with the columns of the module doc, one row per (layer, representation, target,
        seed, eval_split).
    """
    settings = settings or ProbeSettings()
    layers = list(layers or features.layers)
    representations = list(representations or features.representations)
    splits = [s for s in ("train", "test") if s in features.splits]
    if "train" not in splits:
        raise ProbeError(f"{getattr(features, 'path', 'features')}: no train split; probes fit on it.")
    holdout = np.asarray(holdout, dtype=bool)
    found: dict[tuple[str, str, str], list[dict]] = {}
    groups = [(rep, layers[i : i + settings.batch_layers]) for rep in representations
              for i in range(0, len(layers), settings.batch_layers)]  # fmt: skip
    for rep, group in progress_bar(groups, desc="probes", disable=not progress):
        xs = [_layer_features(features, layer, rep, splits, len(holdout)) for layer in group]
        offsets = np.cumsum([0, *xs[0][1]])
        fit_mask, eval_masks = _masks(splits, offsets, holdout)
        for name, by_split in targets.items():
            y = _stacked_target(name, by_split, splits, offsets)
            found.update(_probe_group(xs, group, rep, name, y, fit_mask, eval_masks, settings, device))
    rows = [
        {**(context or {}), "layer": layer, "representation": rep, "target": name, **row}
        for layer in layers
        for rep in representations
        for name in targets
        for row in found[(layer, rep, name)]
    ]
    return pd.DataFrame(rows)


def _layer_features(features: object, layer: str, rep: str, splits: list[str], n_train: int):
    """(N, D) features of one layer and representation over the stacked splits, and each split's
    number of rows."""
    arrays = [features.array(s, layer, rep) for s in splits]
    if len(arrays[0]) != n_train:
        raise ProbeError(
            f"holdout mask has {n_train} entries but the train features {len(arrays[0])} rows; "
            "they come from different data sets."
        )
    return np.concatenate(arrays), [len(a) for a in arrays]


def _masks(splits: list[str], offsets: np.ndarray, holdout: np.ndarray) -> tuple[np.ndarray, dict]:
    """Fit mask (train outside the holdout) and evaluation masks (holdout, test) of stacked splits."""
    n_train = len(holdout)
    in_split = {s: np.zeros(offsets[-1], dtype=bool) for s in splits}
    for s, lo, hi in zip(splits, offsets[:-1], offsets[1:], strict=True):
        in_split[s][lo:hi] = True
    fit_mask = in_split["train"].copy()
    fit_mask[:n_train] &= ~holdout
    hold_mask = in_split["train"].copy()
    hold_mask[:n_train] &= holdout
    eval_masks = {"holdout": hold_mask}
    if "test" in splits:
        eval_masks["test"] = in_split["test"]
    return fit_mask, eval_masks


def _probe_group(xs, group, rep, name, y, fit_mask, eval_masks, settings, device) -> dict:
    """Rows of one target for each layer of ``group``: the ridge probe of a float target layer by
    layer; softmax probes of layers of one width fitted together (:mod:`epochlens.probes.batched`)
    when ``settings.batch_layers`` > 1, else one at a time."""
    out = {}
    if np.issubdtype(y.dtype, np.floating):
        for layer, (x_np, _) in zip(group, xs, strict=True):
            out[(layer, rep, name)] = ridge_seeds(x_np, y, fit_mask, eval_masks, settings)
        return out
    device = resolve_device(device or "auto") if not isinstance(device, torch.device) else device
    widths = {x_np.shape[1] for x_np, _ in xs}
    if settings.kind == "ridge":
        return _ridge_group(xs, group, rep, name, y, fit_mask, eval_masks, settings, device)
    if settings.batch_order == "per_seed" and (settings.batch_layers == 1 or len(widths) > 1):
        for layer, (x_np, _) in zip(group, xs, strict=True):
            out[(layer, rep, name)] = probe_seeds(
                torch.as_tensor(x_np), y, fit_mask, eval_masks, settings, device
            )
        return out
    from epochlens.probes.batched import batched_rows

    use_amp, _ = amp_mode(device, settings.mixed_precision)
    for lo, hi in _width_runs(xs):  # batch_order shared: layers of each width together
        x = torch.as_tensor(np.stack([x_np for x_np, _ in xs[lo:hi]])).to(device)
        with cpu_threads(device, settings.batched_threads):
            per_layer = batched_rows(x, y, fit_mask, eval_masks, settings, use_amp)
        for layer, rows in zip(group[lo:hi], per_layer, strict=True):
            out[(layer, rep, name)] = [row | {"metric": "accuracy"} for row in rows]
    return out


def _width_runs(xs: Sequence[tuple[np.ndarray, list[int]]]) -> Iterator[tuple[int, int]]:
    """(lo, hi) of consecutive layers of ``xs`` of one width, up to :data:`BATCHED_BYTES` of
    features at once."""
    lo = 0
    while lo < len(xs):
        width, hi = xs[lo][0].shape[1], lo + 1
        per_fit = max(1, BATCHED_BYTES // max(xs[lo][0].nbytes, 1))
        while hi < len(xs) and hi - lo < per_fit and xs[hi][0].shape[1] == width:
            hi += 1
        yield lo, hi
        lo = hi


def _ridge_group(xs, group, rep, name, y, fit_mask, eval_masks, settings, device) -> dict:
    """Rows of class ridge probes (:mod:`epochlens.probes.ridge_classes`) of each layer of
    ``group``, layers of one width stacked (up to :data:`BATCHED_BYTES` of features at once)."""
    from epochlens.probes.ridge_classes import class_ridge_rows

    out = {}
    for lo, hi in _width_runs(xs):
        x = torch.as_tensor(np.stack([x_np for x_np, _ in xs[lo:hi]])).to(device)
        names = [f"{layer} ({rep})" for layer in group[lo:hi]]
        with cpu_threads(device, settings.batched_threads):
            per_layer = class_ridge_rows(x, y, fit_mask, eval_masks, settings, names)
        for layer, rows in zip(group[lo:hi], per_layer, strict=True):
            out[(layer, rep, name)] = rows
    return out


def _stacked_target(
    name: str, by_split: Mapping[str, np.ndarray], splits: list[str], offsets: np.ndarray
) -> np.ndarray:
    """One target over the stacked splits: int64 (N,) with -1 where a split has no values, or
    float64 (N,) / (N, D) with NaN there (a float target: a regression's, for the ridge probe)."""
    given = [np.asarray(v) for v in by_split.values()]
    floats = bool(given) and np.issubdtype(given[0].dtype, np.floating)
    if floats:
        shape = given[0].shape[1:]
        y = np.full((offsets[-1], *shape), np.nan, dtype=np.float64)
    else:
        y = np.full(offsets[-1], -1, dtype=np.int64)
    for s, lo, hi in zip(splits, offsets[:-1], offsets[1:], strict=True):
        if s in by_split:
            values = np.asarray(by_split[s])
            if len(values) != hi - lo:
                raise ProbeError(
                    f"target {name!r} has {len(values)} values for split {s!r}, which has {hi - lo} samples."
                )
            if np.issubdtype(values.dtype, np.floating) != floats or values.shape[1:] != y.shape[1:]:
                raise ProbeError(
                    f"target {name!r}: split {s!r} has {values.dtype} values of shape {values.shape[1:]}, "
                    f"another split {y.dtype} of shape {y.shape[1:]}; one target has one kind of value."
                )
            y[lo:hi] = values
    return y


def probe_checkpoint(
    features: object,
    targets: Mapping[str, Mapping[str, np.ndarray]],
    skipped: Mapping[str, str],
    holdout: np.ndarray,
    settings: ProbeSettings,
    context: Mapping[str, object],
    device: torch.device | str | None = "auto",
    progress: bool = False,
) -> pd.DataFrame:
    """The probe table of one checkpoint: :func:`probe_features` rows with ``status`` ok, and one
    row per (layer, representation) of each skipped target with its reason as ``status`` (counts
    empty, not 0). Columns: the context's, then :data:`ROW_COLUMNS` (the ridge probe's only where
    a ridge probe ran or was skipped); ``metric`` on every row (:func:`target_metric`)."""
    parts = []
    if targets:
        table = probe_features(
            features, targets, holdout, settings, context=context, device=device, progress=progress
        )
        parts.append(table.assign(status="ok"))
        holdout_rows = table[table["eval_split"] == "holdout"]
        for (name, metric), rows in holdout_rows.groupby(["target", "metric"], sort=False):
            score = rows["r2" if metric == "r2" else "accuracy"]
            log.info(
                "epoch %s, target %s: holdout %s %.3f .. %.3f over layers",
                context.get("epoch"),
                name,
                "R²" if metric == "r2" else "accuracy",
                score.min(),
                score.max(),
            )
    pairs = [(layer, rep) for layer in features.layers for rep in features.representations]
    if skipped:
        rows = [
            {**context, "layer": layer, "representation": rep, "target": name, "status": why}
            for name, why in skipped.items()
            for layer, rep in pairs
        ]
        parts.append(pd.DataFrame(rows).assign(metric=lambda t: t["target"].map(target_metric)))
    out = pd.concat(parts, ignore_index=True)
    # a ridge probe ran: of a regression's targets (r2), or of classes (probes.kind ridge: alpha)
    ridge = (out["metric"] == "r2").any() or ("alpha" in out and out["alpha"].notna().any())
    columns = [c for c in ROW_COLUMNS if ridge or c not in RIDGE_ONLY_COLUMNS]
    out = out.reindex(columns=[*context, *columns])
    counts = ["seed", "n_features", "n_classes", "n_fit", "n_stop", "n_eval", "best_epoch", "epochs_run"]
    counts += ["n_outputs"] if ridge else []
    out[counts] = out[counts].astype("Int64")  # skipped rows (and a ridge probe's epochs): empty, not 0.0
    return out


def target_metric(target: str) -> str:
    """The score of a probe target's rows: ``r2`` for a regression's ``target`` (the ridge probe),
    ``accuracy`` for every other (a softmax probe of classes or bins)."""
    return "r2" if target == "target" else "accuracy"
