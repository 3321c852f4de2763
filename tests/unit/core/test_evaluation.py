"""Per-checkpoint evaluation by class, task cohort and data group (epochlens.evaluation), against
per-sample predictions computed here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens.evaluation import GROUP_COLUMNS, cohort_table, evaluate_checkpoint, group_table
from epochlens.schedule import ClassSchedule


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))


def per_sample(model, data, active) -> pd.DataFrame:
    """Correctness and loss of every test image of the active classes, one by one."""
    x = data.normalized("test")
    rows = []
    for i, y in enumerate(data.test_labels):
        if y not in active:
            continue
        logits = model(x[i : i + 1]).detach()[:, active]
        target = int(np.flatnonzero(active == y)[0])
        loss = float(nn.functional.cross_entropy(logits, torch.tensor([target])))
        rows.append(dict(i=i, y=int(y), correct=int(logits.argmax()) == target, loss=loss))
    return pd.DataFrame(rows)


def test_groups_split_the_class_rows_and_add_up(tiny_dataset) -> None:
    data = tiny_dataset
    data.train_groups = np.arange(12) % 2
    data.test_groups = np.array([0, 0, 1, 1, 0, 1])
    data.group_names = ["lab", "web"]
    schedule = ClassSchedule(np.array([2, 0, 1]), 2, 1, 5)  # classes 2, 0 at epoch 5
    model = linear_model()
    table = evaluate_checkpoint(model, data, schedule, epoch=5)
    test = table[table["split"] == "test"]
    truth = per_sample(model, data, schedule.active_classes(5))
    truth["data_group"] = np.array(data.group_names)[data.test_groups[truth["i"]]]
    expected = truth.groupby(["y", "data_group"]).agg(n=("correct", "size"), n_correct=("correct", "sum"))
    got = test.set_index(["class_id", "data_group"])[["n", "n_correct"]].sort_index()
    pd.testing.assert_frame_equal(got, expected.rename_axis(["class_id", "data_group"]), check_dtype=False)
    assert list(table.columns[:5]) == ["epoch", "split", "class_id", "class_name", "data_group"]

    groups = group_table(table.assign(index=0))
    assert tuple(groups.columns) == GROUP_COLUMNS
    lab = groups[(groups["split"] == "test") & (groups["data_group"] == "lab")].iloc[0]
    in_lab = truth[truth["data_group"] == "lab"]
    assert lab["n"] == len(in_lab) and lab["accuracy"] == in_lab["correct"].mean()
    np.testing.assert_allclose(lab["mean_loss"], in_lab["loss"].mean(), rtol=1e-6)
    # the cohort table counts every image once, whatever the groups
    cohorts = cohort_table(table.assign(index=0), 5)
    test_ages = cohorts[(cohorts["split"] == "test") & cohorts["group"].isin(["new", "old"])]
    assert test_ages["n"].sum() == len(truth)


def test_without_groups_the_tables_are_as_before(tiny_dataset) -> None:
    schedule = ClassSchedule(np.array([0, 1, 2]), 3, 0, 5)
    table = evaluate_checkpoint(linear_model(), tiny_dataset, schedule, epoch=5)
    assert "data_group" not in table and len(table[table["split"] == "test"]) == 3
    empty = group_table(table.assign(index=0))
    assert empty.empty and tuple(empty.columns) == GROUP_COLUMNS
