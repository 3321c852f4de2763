"""What every probe of one target shares (:func:`probe_plan`): its classes, its evaluation sets with
their chance accuracy, and each seed's stratified fit and early-stopping rows.

The softmax probes fitted one at a time (:mod:`epochlens.probes.linear`), batched
(:mod:`epochlens.probes.batched`) and the class ridge probes (:mod:`epochlens.probes.ridge_classes`)
all start from it, so their splits are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from epochlens.errors import ProbeError
from epochlens.probes.settings import ProbeSettings


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


@dataclass
class ProbePlan:
    """What every probe of one target shares: classes, evaluation sets, each seed's rows."""

    n_classes: int
    eval_sets: dict[str, torch.Tensor]  # name -> row positions (on the device)
    chance: dict[str, float]  # accuracy of the fit set's majority class on each evaluation set
    seed_rows: list[tuple[torch.Tensor, torch.Tensor]]  # per seed: (fit rows, early-stopping rows)

    def row(
        self, seed: int, name: str, d: int, n_fit: int, n_stop: int, n_eval: int, acc: float, loss: float,
        fit_acc: float,
    ) -> dict:  # fmt: skip
        """One row of :func:`probe_seeds` but for best_epoch and epochs_run."""
        return {
            "seed": seed,
            "eval_split": name,
            "n_features": d,
            "n_classes": self.n_classes,
            "n_fit": n_fit,
            "n_stop": n_stop,
            "n_eval": n_eval,
            "accuracy": acc,
            "loss": loss,
            "chance": self.chance[name],
            "fit_accuracy": fit_acc,
        }


def probe_plan(
    y: np.ndarray,
    fit_mask: np.ndarray,
    eval_masks: Mapping[str, np.ndarray],
    settings: ProbeSettings,
    device: torch.device,
) -> ProbePlan:
    """The classes, evaluation sets and per-seed (stratified) fit and early-stopping rows of a
    target ``y`` (N,) (-1 where undefined); ProbeError when there is nothing to fit."""
    y = np.asarray(y, dtype=np.int64)
    defined = y >= 0
    fit_pos = np.flatnonzero(np.asarray(fit_mask, dtype=bool) & defined)
    if len(fit_pos) < 2 or len(np.unique(y[fit_pos])) < 2:
        raise ProbeError(
            f"{len(fit_pos)} fit samples with {len(np.unique(y[fit_pos]))} distinct target(s): a probe "
            "needs at least two samples of two targets."
        )
    n_classes = int(y[defined].max()) + 1
    majority = int(np.bincount(y[fit_pos], minlength=n_classes).argmax())
    eval_sets, chance = {}, {}
    for name, mask in eval_masks.items():
        ev = np.flatnonzero(np.asarray(mask, dtype=bool) & defined)
        if len(ev):
            eval_sets[name] = torch.as_tensor(ev, device=device)
            chance[name] = float(np.mean(y[ev] == majority))
    seed_rows = []
    for seed in settings.seeds:
        keep, held = stratified_split(y[fit_pos], settings.stop_fraction, seed)
        seed_rows.append(
            (torch.as_tensor(fit_pos[keep], device=device), torch.as_tensor(fit_pos[held], device=device))
        )
    return ProbePlan(n_classes, eval_sets, chance, seed_rows)
