"""Per-sample summaries over checkpoints (arrays (m checkpoints, N samples), NaN where a sample
was not active), each over the checkpoints at which the sample is active:

    confidence(x)  = mean_e p_label_e(x)          Dataset Cartography (Swayamdipta et al. 2020)
    variability(x) = std_e p_label_e(x)           population std (ddof 0), as allenai/cartography
    correctness(x) = mean_e correct_e(x)          the fraction of checkpoints it is predicted right
    aum(x)         = mean_e margin_e(x)           area under the margin (Pleiss et al. 2020)

A regression has no probability of its label: :func:`error_map` gives the data map's analogue,
the mean and the std over checkpoints of the absolute error, and no correctness (an accuracy of a
regression is refused, not computed). Learning time, forgetting events and CSL are those of
:func:`epochlens.curvature.dynamics.sample_dynamics` (:func:`loss_dynamics`).

These are summaries of the *analysed checkpoints* (Cartography takes one value per training
epoch; a run's checkpoints are what it has cached): with few checkpoints they are coarse.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from epochlens.curvature.dynamics import sample_dynamics


def _active(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """values (m, N) float64, the finite mask and the count of finite values per sample."""
    values = np.asarray(values, np.float64)
    if values.ndim != 2:
        raise ValueError(f"expected (checkpoints, samples), got shape {values.shape}")
    finite = np.isfinite(values)
    return values, finite, finite.sum(0)


def nan_mean_std(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std over axis 0 of the finite values; NaN for a sample with none."""
    values, finite, n = _active(values)
    safe = np.where(finite, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, safe.sum(0) / n, np.nan)
        var = np.where(finite, (values - mean) ** 2, 0.0).sum(0) / n
    return mean, np.where(n > 0, np.sqrt(var), np.nan)


def cartography(p_label: np.ndarray, correct: np.ndarray) -> dict[str, np.ndarray]:
    """confidence, variability and correctness (N,) from p_label (m, N) (NaN: inactive) and
    correct (m, N) bool, each over the checkpoints where p_label is finite."""
    confidence, variability = nan_mean_std(p_label)
    _, finite, n = _active(p_label)
    hits = (np.asarray(correct, bool) & finite).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        correctness = np.where(n > 0, hits / n, np.nan)
    return {"confidence": confidence, "variability": variability, "correctness": correctness}


def aum(margin: np.ndarray) -> np.ndarray:
    """Area under the margin (N,): the mean margin over the checkpoints where it is finite."""
    return nan_mean_std(margin)[0]


def error_map(abs_error: np.ndarray) -> dict[str, np.ndarray]:
    """A regression's data map: mean and std over checkpoints of the absolute error (N,)."""
    mean, std = nan_mean_std(abs_error)
    return {"error_mean": mean, "error_variability": std}


def loss_dynamics(
    epochs: Sequence[int], loss: np.ndarray, correct: np.ndarray, labels: np.ndarray
) -> dict[str, np.ndarray]:
    """learning_time, forgetting_events and csl (N,) of loss and correct (m, N), as
    :func:`~epochlens.curvature.dynamics.sample_dynamics` defines them (NaN loss: inactive)."""
    nan = np.full(np.shape(loss)[1], np.nan)
    per_epoch = [
        {
            "loss": np.asarray(loss[e], np.float64),
            "correct": np.asarray(correct[e], bool),
            "grad_norm": nan,
            "curvature": nan,
            "labels": np.asarray(labels),
            "holdout": np.zeros(len(nan), bool),
        }
        for e in range(len(epochs))
    ]
    task_of_class = np.zeros(int(np.max(labels, initial=0)) + 1, np.int64)
    table = sample_dynamics(list(epochs), per_epoch, task_of_class, epochs_per_task=1)
    return {
        "learning_time": table["learning_time"].to_numpy(np.float64),
        "forgetting_events": table["forgetting_events"].to_numpy(np.int32),
        "csl": table["csl"].to_numpy(np.float64),
    }


def curvature_summary(curvature: np.ndarray) -> dict[str, np.ndarray]:
    """curvature_mean and curvature_max (N,) over the checkpoints where it is finite."""
    values, finite, n = _active(curvature)
    mean = nan_mean_std(values)[0]
    top = np.where(finite, values, -np.inf).max(0)
    return {"curvature_mean": mean, "curvature_max": np.where(n > 0, top, np.nan)}
