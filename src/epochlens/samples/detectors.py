"""Every detector as a score and a flag per training sample (cleanlab Datalab's convention:
``{detector}_score``, ``is_{detector}``), higher scores more suspect.

Detectors: each influence method's ``{method}_self_influence``, ``{method}_query_influence`` and
``{method}_query_influence_{transform}`` per query transform (the signals of
``tables/poison_detection.csv``), the final checkpoint's ``loss``, and ``aum``
(a low area under the margin marks a likely mislabel: its score is −AUM). A sample is flagged when
its score lies above Tukey's upper fence, Q3 + 1.5·IQR of the scores of the samples trained on
(the holdout is scored where it has a score but sets no fence). The fence uses no ground truth:
how well each score finds the known corrupted samples is the detection table's AUROC.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: Tukey's fence multiplier of the interquartile range.
FENCE_IQR = 1.5


def upper_fence(scores: np.ndarray, trained: np.ndarray) -> float:
    """Q3 + 1.5·IQR of the finite scores of the trained samples (NaN when there are none)."""
    values = np.asarray(scores, np.float64)[np.asarray(trained, bool)]
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan")
    q1, q3 = np.percentile(values, [25, 75])
    return float(q3 + FENCE_IQR * (q3 - q1))


def detector_columns(scores: Mapping[str, np.ndarray], trained: np.ndarray) -> dict[str, np.ndarray]:
    """``{name}_score`` (float64) and ``is_{name}`` (bool: above the fence) of each detector."""
    cols = {}
    for name, values in scores.items():
        values = np.asarray(values, np.float64)
        fence = upper_fence(values, trained)
        cols[f"{name}_score"] = values
        with np.errstate(invalid="ignore"):
            cols[f"is_{name}"] = np.isfinite(values) & (values > fence)
    return cols


def detector_scores(
    columns: Mapping[str, np.ndarray],
    methods: list[str],
    final_loss: np.ndarray | None,
    transformed: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The detectors' scores from the dossier's columns: influence per method (and ``transformed``,
    its query influence per query transform, keyed ``{method}_query_influence_{transform}``),
    final loss, AUM."""
    scores = {}
    transformed = transformed or {}
    for method in methods:
        for signal in ("self_influence", "query_influence"):
            if f"{signal}_{method}" in columns:
                scores[f"{method}_{signal}"] = np.asarray(columns[f"{signal}_{method}"], np.float64)
        scores.update({k: v for k, v in transformed.items() if k.startswith(f"{method}_query_influence_")})
    if final_loss is not None:
        scores["loss"] = np.asarray(final_loss, np.float64)
    if "aum" in columns:
        scores["aum"] = -np.asarray(columns["aum"], np.float64)
    return scores
