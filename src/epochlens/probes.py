"""Linear probes on cached features: can a layer's representation predict a target?

A probe is a softmax regression (one linear layer) on standardised features, trained with Adam on
mini-batches and stopped early. Everything stays on one device: the features of a (layer,
representation) move there once, mini-batches are index slices of the resident tensor (no
DataLoader, no workers). On CUDA the forward pass runs under autocast (bfloat16 where the GPU
supports it, else float16 with a gradient scaler); on the CPU and MPS it is float32.

Splits (from the data's holdout, see ``epochlens.data.holdout_mask``):

* fit: training samples outside the holdout, less a per-seed random ``stop_fraction`` of them
  (stratified by target), on which the loss decides early stopping;
* evaluation: ``holdout``, the training holdout (the loss-of-plasticity validation images), and
  ``test``, the test split, wherever the target is defined there. The holdout is the primary
  evaluation split: per-sample curvature exists for training images only, so the curvature
  target has no test rows.

Seeds change the early-stopping subset and the mini-batch order (weights start at zero: the
problem is convex, so the solution does not depend on an initialisation).

Targets (arrays with -1 where undefined; such samples are left out of fitting and evaluation):

* ``class``: the position of the label among the active classes (:func:`class_target`);
* ``cohort``: 0 for classes of earlier tasks (old), 1 for the current task's (new) classes;
* ``curvature_q{n}``: the quantile bin (0 .. n-1) of each training sample's curvature
  (:func:`quantile_target`), i.e. can the layer tell high-curvature (memorised) samples apart.

Tidy output (:func:`probe_features`), one row per (layer, representation, target, seed, eval
split), with any context columns (e.g. epoch) first: layer, representation, target, seed,
eval_split, n_features, n_classes, n_fit, n_stop, n_eval, accuracy, loss, chance, fit_accuracy,
best_epoch, epochs_run. ``loss`` is the mean cross-entropy (nats); ``chance`` the accuracy of
always predicting the most frequent class of the fit set. :func:`aggregate_seeds` reduces the seeds
to mean, standard deviation and a 95% t-interval half-width.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from epochlens.device import resolve_device
from epochlens.errors import ConfigError, EpochlensError
from epochlens.models import positions_in
from epochlens.progress import progress_bar

ID_COLUMNS = ("layer", "representation", "target", "eval_split")
METRIC_COLUMNS = ("accuracy", "loss", "fit_accuracy", "best_epoch")


class ProbeError(EpochlensError):
    """Probe inputs that cannot work (too few samples, mismatched lengths)."""


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
        default=True, metadata={"help": "autocast on CUDA (bfloat16, else float16); ignored elsewhere"}
    )
    cpu_threads: int | None = field(
        default=1,
        metadata={
            "help": "torch intra-op threads while probing on the CPU (restored afterwards); the small "
            "matrix products of a probe run fastest on one thread. None: leave torch's setting"
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


# ---------------------------------------------------------------------------------------------
# Targets


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


# ---------------------------------------------------------------------------------------------
# Training


@dataclass
class ProbeFit:
    """A trained probe: logits = ((x - mean) / scale) @ weight + bias."""

    weight: torch.Tensor  # (D, K)
    bias: torch.Tensor  # (K,)
    mean: torch.Tensor  # (D,)
    scale: torch.Tensor  # (D,)
    best_epoch: int  # epoch (1-based) whose weights were kept
    epochs_run: int

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K) float32 logits of features (N, D) on the probe's device."""
        return ((x.float() - self.mean) / self.scale) @ self.weight + self.bias

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 8192) -> tuple[float, float]:
        """(accuracy, mean cross-entropy in nats) on features (N, D) and targets (N,)."""
        if len(y) == 0:
            return math.nan, math.nan
        correct, loss = 0.0, 0.0
        for lo in range(0, len(y), batch_size):
            logits = self.logits(x[lo : lo + batch_size])
            yb = y[lo : lo + batch_size]
            correct += float((logits.argmax(1) == yb).sum())
            loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        return correct / len(y), loss / len(y)


def _amp(device: torch.device, enabled: bool) -> tuple[bool, torch.dtype]:
    if not enabled or device.type != "cuda":
        return False, torch.float32
    return True, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def train_linear_probe(
    x_fit: torch.Tensor,
    y_fit: torch.Tensor,
    x_stop: torch.Tensor | None,
    y_stop: torch.Tensor | None,
    n_classes: int,
    settings: ProbeSettings,
    seed: int,
) -> ProbeFit:
    """Train a softmax-regression probe on the device of ``x_fit``.

    Args:
        x_fit, y_fit: (N, D) features and (N,) int64 targets in 0 .. n_classes-1.
        x_stop, y_stop: early-stopping samples (None or empty: stop on the fit loss instead).
        n_classes: number of outputs K.
        settings: optimiser and early-stopping settings.
        seed: seed of the mini-batch order.

    Returns:
        The :class:`ProbeFit` of the epoch with the lowest early-stopping loss.
    """
    with cpu_threads(x_fit.device, settings.cpu_threads):
        return _train(x_fit, y_fit, x_stop, y_stop, n_classes, settings, seed)


@contextmanager
def cpu_threads(device: torch.device, n: int | None) -> Iterator[None]:
    """Inside the block, torch uses ``n`` intra-op threads if ``device`` is the CPU (then restores)."""
    if device.type != "cpu" or n is None or n == torch.get_num_threads():
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _train(
    x_fit: torch.Tensor,
    y_fit: torch.Tensor,
    x_stop: torch.Tensor | None,
    y_stop: torch.Tensor | None,
    n_classes: int,
    settings: ProbeSettings,
    seed: int,
) -> ProbeFit:
    device = x_fit.device
    n, d = x_fit.shape
    if n < 1:
        raise ProbeError("no samples to fit the probe on")
    x_fit = x_fit.float()
    mean = x_fit.mean(0) if settings.standardize else torch.zeros(d, device=device)
    scale = x_fit.std(0, correction=0) if settings.standardize else torch.ones(d, device=device)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if x_stop is None or y_stop is None or len(y_stop) == 0:
        x_stop, y_stop = x_fit, y_fit
    xs_fit = (x_fit - mean) / scale  # standardised once; batches are index slices
    xs_stop = (x_stop.float() - mean) / scale
    weight = torch.zeros(d, n_classes, device=device, requires_grad=True)
    bias = torch.zeros(n_classes, device=device, requires_grad=True)
    opt = torch.optim.Adam([weight, bias], lr=settings.lr)
    use_amp, amp_dtype = _amp(device, settings.mixed_precision)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def stop_loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(xs_stop @ weight + bias, y_stop))

    best = (stop_loss(), weight.detach().clone(), bias.detach().clone(), 0)
    since_best, epoch = 0, 0
    for epoch in range(1, settings.max_epochs + 1):
        order = torch.randperm(n, generator=gen).to(device)
        for lo in range(0, n, settings.batch_size):
            idx = order[lo : lo + settings.batch_size]
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
                logits = xs_fit[idx] @ weight + bias
            loss = F.cross_entropy(logits.float(), y_fit[idx])
            if settings.weight_decay:
                loss = loss + 0.5 * settings.weight_decay * weight.square().sum()
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        current = stop_loss()
        if not math.isfinite(current):
            raise ProbeError(
                f"probe loss became {current} at epoch {epoch}: features with extreme values. Keep "
                "standardize on or lower lr."
            )
        if current < best[0] - settings.min_delta:
            best = (current, weight.detach().clone(), bias.detach().clone(), epoch)
            since_best = 0
        else:
            since_best += 1
            if since_best >= settings.patience:
                break
    return ProbeFit(best[1], best[2], mean, scale, best[3], epoch)


def stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split positions 0..N-1 into (keep, held) with ``round(fraction * n_c)`` held per class.

    Classes with a single sample stay whole in ``keep``. Deterministic given ``seed``.
    """
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        k = int(round(fraction * len(idx))) if len(idx) > 1 else 0
        k = min(k, len(idx) - 1)
        held.append(rng.permutation(idx)[:k])
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    keep = np.setdiff1d(np.arange(len(y)), held_idx)
    return keep, held_idx


def probe_seeds(
    x: torch.Tensor | np.ndarray,
    y: np.ndarray,
    fit_mask: np.ndarray,
    eval_masks: Mapping[str, np.ndarray],
    settings: ProbeSettings | None = None,
    device: torch.device | str | None = None,
) -> list[dict]:
    """Train one probe per seed and evaluate it: rows of seed, eval_split and the metrics.

    Args:
        x: (N, D) features of every sample (moved to ``device`` once).
        y: (N,) int64 targets, -1 where undefined (left out everywhere).
        fit_mask: (N,) bool, the samples to fit (and to draw the early-stopping subset from).
        eval_masks: name -> (N,) bool, the evaluation sets (e.g. holdout, test).
        settings: probe settings.
        device: "auto", "cpu", "cuda", ...; None: the device of ``x`` if a tensor, else "auto".

    Returns:
        One dict per (seed, evaluation set) with keys seed, eval_split, n_features, n_classes,
        n_fit, n_stop, n_eval, accuracy, loss, chance, fit_accuracy, best_epoch, epochs_run.
    """
    settings = settings or ProbeSettings()
    y = np.asarray(y, dtype=np.int64)
    if x.shape[0] != len(y) or len(fit_mask) != len(y) or any(len(m) != len(y) for m in eval_masks.values()):
        raise ProbeError(
            f"features ({x.shape[0]} rows), targets ({len(y)}), fit mask ({len(fit_mask)}) and "
            "evaluation masks must all have one entry per sample"
        )
    if device is None:
        device = x.device if isinstance(x, torch.Tensor) else "auto"
    device = resolve_device(device) if isinstance(device, str) else torch.device(device)
    defined = y >= 0
    fit_pos = np.flatnonzero(np.asarray(fit_mask, dtype=bool) & defined)
    if len(fit_pos) < 2 or len(np.unique(y[fit_pos])) < 2:
        raise ProbeError(
            f"{len(fit_pos)} fit samples with {len(np.unique(y[fit_pos]))} distinct target(s): a probe "
            "needs at least two samples of two targets."
        )
    n_classes = int(y[defined].max()) + 1
    x_dev = torch.as_tensor(x).to(device)
    y_dev = torch.as_tensor(y).to(device)
    majority = int(np.bincount(y[fit_pos], minlength=n_classes).argmax())
    eval_sets, chance = {}, {}
    for name, mask in eval_masks.items():
        ev = np.flatnonzero(np.asarray(mask, dtype=bool) & defined)
        if len(ev):
            eval_sets[name] = torch.as_tensor(ev, device=device)
            chance[name] = float(np.mean(y[ev] == majority))
    rows = []
    with cpu_threads(device, settings.cpu_threads):
        for seed in settings.seeds:
            keep, held = stratified_split(y[fit_pos], settings.stop_fraction, seed)
            fit_idx = torch.as_tensor(fit_pos[keep], device=device)
            stop_idx = torch.as_tensor(fit_pos[held], device=device)
            probe = train_linear_probe(
                x_dev[fit_idx], y_dev[fit_idx], x_dev[stop_idx], y_dev[stop_idx], n_classes, settings, seed
            )
            fit_acc, _ = probe.evaluate(x_dev[fit_idx], y_dev[fit_idx])
            for name, ev in eval_sets.items():
                acc, loss = probe.evaluate(x_dev[ev], y_dev[ev])
                rows.append(
                    {
                        "seed": seed,
                        "eval_split": name,
                        "n_features": int(x.shape[1]),
                        "n_classes": n_classes,
                        "n_fit": len(keep),
                        "n_stop": len(held),
                        "n_eval": len(ev),
                        "accuracy": acc,
                        "loss": loss,
                        "chance": chance[name],
                        "fit_accuracy": fit_acc,
                        "best_epoch": probe.best_epoch,
                        "epochs_run": probe.epochs_run,
                    }
                )
    return rows


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
        features: a :class:`epochlens.features.FeatureSet` (anything with ``layers``,
            ``representations``, ``splits`` and ``array(split, layer, representation)``).
        targets: ``targets[name][split]`` (N_split,) int64, -1 where undefined
            (see :func:`standard_targets`); splits missing for a target are not used.
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
    n_train = len(holdout)
    holdout = np.asarray(holdout, dtype=bool)
    rows = []
    pairs = [(layer, r) for layer in layers for r in representations]
    for layer, rep in progress_bar(pairs, desc="probes", disable=not progress):
        arrays = [features.array(s, layer, rep) for s in splits]
        if len(arrays[0]) != n_train:
            raise ProbeError(
                f"holdout mask has {n_train} entries but the train features {len(arrays[0])} rows; "
                "they come from different data sets."
            )
        x = torch.as_tensor(np.concatenate(arrays))
        offsets = np.cumsum([0] + [len(a) for a in arrays])
        in_split = {s: np.zeros(len(x), dtype=bool) for s in splits}
        for s, lo, hi in zip(splits, offsets[:-1], offsets[1:], strict=True):
            in_split[s][lo:hi] = True
        fit_mask = in_split["train"].copy()
        fit_mask[:n_train] &= ~holdout
        hold_mask = in_split["train"].copy()
        hold_mask[:n_train] &= holdout
        eval_masks = {"holdout": hold_mask}
        if "test" in splits:
            eval_masks["test"] = in_split["test"]
        for name, by_split in targets.items():
            y = np.full(len(x), -1, dtype=np.int64)
            for s, lo, hi in zip(splits, offsets[:-1], offsets[1:], strict=True):
                if s in by_split:
                    values = np.asarray(by_split[s], dtype=np.int64)
                    if len(values) != hi - lo:
                        raise ProbeError(
                            f"target {name!r} has {len(values)} values for split {s!r}, which has "
                            f"{hi - lo} samples."
                        )
                    y[lo:hi] = values
            for row in probe_seeds(x, y, fit_mask, eval_masks, settings, device):
                rows.append({**(context or {}), "layer": layer, "representation": rep, "target": name, **row})
    return pd.DataFrame(rows)


def aggregate_seeds(table: pd.DataFrame, metrics: Sequence[str] = METRIC_COLUMNS) -> pd.DataFrame:
    """Mean, std (ddof 1) and 95% t-interval half-width over seeds of each metric.

    Groups by every column except ``seed``, the metrics and the per-seed counts/epochs; output
    columns: the group columns, n_seeds, and ``{metric}_mean``, ``{metric}_std``, ``{metric}_ci95``.
    With one seed std and ci95 are NaN.
    """
    from scipy import stats

    per_seed = {"seed", "n_fit", "n_stop", "epochs_run", *metrics}
    keys = [c for c in table.columns if c not in per_seed]
    grouped = table.groupby(keys, sort=False, dropna=False)
    out = grouped.size().rename("n_seeds").reset_index()
    for m in metrics:
        agg = grouped[m].agg(["mean", "std"]).reset_index(drop=True)
        out[f"{m}_mean"] = agg["mean"].to_numpy()
        out[f"{m}_std"] = agg["std"].to_numpy()
        n = out["n_seeds"].to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            t = np.where(n > 1, stats.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)
            out[f"{m}_ci95"] = t * out[f"{m}_std"].to_numpy() / np.sqrt(n)
    return out
