"""The detectors' ROC curves and AUROCs against the ground truth, computed when the explorer is built
(scikit-learn's ``roc_curve`` and ``roc_auc_score``) and drawn by the page.

A detector is a ``{name}_score`` column (higher = more suspect, cleanlab's convention: the dossier's
``{method}_self_influence_score``, ``{method}_query_influence_score``, ``loss_score``, ...); the
ground truth is ``is_corrupted`` over the trained rows (role train, split train: the holdout is not
trained on), as the run's poison_detection table computes it. Without ground truth, or with one
class only, there is no ROC, and the page says why.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

#: At most this many points of a curve go to the page (the AUROC is of the full curve).
MAX_POINTS = 400


def detector_columns(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith("_score")]


def _thin(fpr: np.ndarray, tpr: np.ndarray) -> tuple[list[float], list[float]]:
    if len(fpr) > MAX_POINTS:
        keep = np.unique(np.linspace(0, len(fpr) - 1, MAX_POINTS).round().astype(int))
        fpr, tpr = fpr[keep], tpr[keep]
    return [round(float(v), 5) for v in fpr], [round(float(v), 5) for v in tpr]


def detector_rocs(scores: dict[str, np.ndarray], truth: np.ndarray | None, train: np.ndarray) -> dict:
    """{"curves": [{name, auroc, n_positive, n_negative, fpr, tpr}], "note": why none, or None}.

    ``truth`` holds 1 (corrupted), 0 (clean) or -1 (unknown) per row; ``train`` marks trained rows.
    A row whose score is NaN is left out of that detector's curve (its count says how many remain).
    """
    if truth is None:
        return {"curves": [], "note": "the dossier has no ground truth (is_corrupted)"}
    known = train & (truth >= 0)
    if len(np.unique(truth[known])) < 2:
        return {"curves": [], "note": "the ground truth has one class only: no ROC"}
    curves = []
    for name, score in scores.items():
        ok = known & np.isfinite(score)
        y, s = truth[ok], score[ok].astype(np.float64)
        if len(np.unique(y)) < 2:
            continue
        fpr, tpr, _ = roc_curve(y, s)
        xs, ys = _thin(fpr, tpr)
        curves.append(
            {
                "name": name,
                "auroc": float(roc_auc_score(y, s)),
                "n_positive": int(y.sum()),
                "n_negative": int((1 - y).sum()),
                "fpr": xs,
                "tpr": ys,
            }
        )
    return {"curves": curves, "note": None}
