"""CSL, learning time and cohort tables on hand-computed examples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from epochlens.curvature.dynamics import cohort_curvature, sample_dynamics
from epochlens.errors import EpochlensError

NAN = np.nan
EPOCHS = [0, 3, 6, 9]
TASK_OF_CLASS = np.array([0, 1, 0, 1])  # classes 0, 2 in task 0; 1, 3 in task 1
LABELS = np.array([0, 2, 1, 3])


def _epoch(loss, correct, curvature=None):
    loss = np.asarray(loss, dtype=np.float32)
    curvature = loss * 10 if curvature is None else np.asarray(curvature, dtype=np.float32)
    return {
        "loss": loss,
        "grad_norm": loss * 2,
        "curvature": curvature,
        "directional_eig": curvature / 2,
        "correct": np.asarray(correct, dtype=bool),
        "labels": LABELS,
        "holdout": np.array([False, True, False, False]),
    }


# sample 0: task 0, correct from epoch 3 on          -> learning time 3
# sample 1: task 0, correct, forgotten at 6, relearned -> learning time 9, one forgetting event
# sample 2: task 1 (active from 6), correct at 6 and 9 -> learning time 6; task 1 starts at
#           epoch 5 (epochs_per_task 5), so epochs_to_learn 1
# sample 3: task 1 (active from 6), wrong at 9        -> never learned
PER_EPOCH = [
    _epoch([1.0, 2.0, NAN, NAN], [0, 1, 0, 0]),
    _epoch([0.5, 0.2, NAN, NAN], [1, 1, 0, 0]),
    _epoch([0.25, 3.0, 1.5, 0.75], [1, 0, 1, 1]),
    _epoch([0.25, 0.1, 0.5, 2.0], [1, 1, 1, 0]),
]


def test_sample_dynamics_by_hand():
    df = sample_dynamics(EPOCHS, PER_EPOCH, TASK_OF_CLASS, epochs_per_task=5).set_index("sample")
    np.testing.assert_allclose(df["csl"], [2.0, 5.3, 2.0, 2.75], rtol=1e-6)
    np.testing.assert_allclose(df["csl_mean"], [0.5, 5.3 / 4, 1.0, 1.375], rtol=1e-6)
    np.testing.assert_allclose(df["cumulative_grad_norm"], 2 * df["csl"], rtol=1e-6)
    np.testing.assert_array_equal(df["n_epochs"], [4, 4, 2, 2])
    np.testing.assert_array_equal(df["first_active_epoch"], [0, 0, 6, 6])
    np.testing.assert_array_equal(df["learning_time"], [3, 9, 6, NAN])
    np.testing.assert_array_equal(df["epochs_to_learn"], [3, 9, 1, NAN])
    np.testing.assert_array_equal(df["forgetting_events"], [0, 1, 0, 1])
    np.testing.assert_array_equal(df["task"], [0, 0, 1, 1])
    np.testing.assert_array_equal(df["holdout"], [False, True, False, False])
    np.testing.assert_allclose(df["curvature_mean"], 10 * df["csl_mean"], rtol=1e-6)
    np.testing.assert_allclose(df["curvature_max"], [10, 30, 15, 20], rtol=1e-6)
    np.testing.assert_allclose(df["curvature_final"], [2.5, 1.0, 5.0, 20.0], rtol=1e-6)
    np.testing.assert_array_equal(df["correct_final"], [True, True, True, False])


def test_never_active_sample_has_no_statistics():
    per_epoch = [_epoch([1.0, 1.0, NAN, NAN], [1, 1, 0, 0]) for _ in EPOCHS]
    df = sample_dynamics(EPOCHS, per_epoch, TASK_OF_CLASS, 5)
    assert (df.loc[2:, "n_epochs"] == 0).all()
    assert df.loc[2:, ["csl", "learning_time", "curvature_final"]].isna().all().all()
    assert not df.loc[2:, "correct_final"].any()


def test_mismatched_labels_between_epochs_are_refused():
    other = dict(PER_EPOCH[2], labels=LABELS[::-1])
    with pytest.raises(EpochlensError, match="epoch 6: per_image_labels differ"):
        sample_dynamics(EPOCHS, [*PER_EPOCH[:2], other, PER_EPOCH[3]], TASK_OF_CLASS, 5)


def test_cohort_curvature_groups_and_quantiles():
    df = cohort_curvature(EPOCHS, PER_EPOCH, TASK_OF_CLASS[LABELS], epochs_per_task=6)
    at9 = df[df["epoch"] == 9].set_index("group")
    # epoch 9 is within task 1 (epochs 7..12): task 1 is new, task 0 old
    assert set(at9.index) == {"cohort 0", "cohort 1", "old", "new"}
    assert at9.loc["old", "n"] == 2 and at9.loc["new", "n"] == 2
    np.testing.assert_allclose(at9.loc["cohort 0", "curvature_mean"], (2.5 + 1.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(at9.loc["new", "curvature_q50"], (5.0 + 20.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(at9.loc["new", "accuracy"], 0.5)
    at3 = df[df["epoch"] == 3].set_index("group")
    # epoch 3: only task 0 active, and it is the newest: no "old" row
    assert set(at3.index) == {"cohort 0", "new"}
    assert pd.api.types.is_integer_dtype(df["cohort"])


def test_cohort_curvature_per_data_group():
    """Data groups (e.g. each image's source) get rows of their own over the active samples."""
    source = np.array(["lab", "web", "web", "lab"], dtype=object)
    df = cohort_curvature(EPOCHS, PER_EPOCH, TASK_OF_CLASS[LABELS], 6, sample_group=source)
    at9 = df[df["epoch"] == 9].set_index("group")
    assert {"data: lab", "data: web"} <= set(at9.index) and (
        at9.loc[["data: lab", "data: web"], "cohort"] == -2
    ).all()
    curvature, loss = PER_EPOCH[3]["curvature"], PER_EPOCH[3]["loss"]  # epoch 9
    active = np.isfinite(loss)
    for name in ("lab", "web"):
        mask = active & (source == name)
        assert at9.loc[f"data: {name}", "n"] == mask.sum()
        np.testing.assert_allclose(
            at9.loc[f"data: {name}", "curvature_mean"], np.mean(curvature[mask]), rtol=1e-6
        )
    # without groups: as before
    assert (
        not cohort_curvature(EPOCHS, PER_EPOCH, TASK_OF_CLASS[LABELS], 6)["group"]
        .str.startswith("data")
        .any()
    )
