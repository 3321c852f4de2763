"""Per-checkpoint evaluation by class, task cohort and data group (epochlens.evaluation), against
per-sample predictions computed here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from epochlens.data import Dataset
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


# ---------------------------------------------------------------- regression
def regression_data(rng: np.random.Generator, d_out: int = 3) -> Dataset:
    x = rng.standard_normal((40, 5)).astype(np.float32)
    y = rng.standard_normal((40, d_out)).astype(np.float32)
    return Dataset(
        "reg", "test", x[:30], y[:30], x[30:], y[30:], 0, 1.0, (0.0,), (1.0,), kind="regression",
        holdout=np.arange(30) < 8, train_groups=np.arange(30) % 2, test_groups=np.arange(10) % 2,
        group_names=["a", "b"],
    )  # fmt: skip


def test_regression_metrics_equal_torch_and_scikit_learn(rng) -> None:
    from sklearn.metrics import r2_score

    from epochlens.evaluation import REGRESSION_COLUMNS, evaluate_regression

    data = regression_data(rng)
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    table = evaluate_regression(model, data, epoch=7, batch_size=4)
    assert list(table.columns) == list(REGRESSION_COLUMNS)
    assert "accuracy" not in table  # no classification metric for a regression
    assert table[["split", "data_group"]].values.tolist() == [
        ["test", "all"], ["test", "a"], ["test", "b"], ["holdout", "all"], ["holdout", "a"], ["holdout", "b"],
    ]  # fmt: skip
    with torch.no_grad():
        z = model(torch.from_numpy(data.test_images))
    y = torch.from_numpy(data.test_labels)
    test = table[(table["split"] == "test") & (table["data_group"] == "all")].iloc[0]
    np.testing.assert_allclose(test["mse"], float(nn.functional.mse_loss(z, y)), rtol=1e-6)
    np.testing.assert_allclose(test["mae"], float(nn.functional.l1_loss(z, y)), rtol=1e-6)
    np.testing.assert_allclose(test["mean_loss"], test["mse"], rtol=1e-6)  # mean reduction: the same
    np.testing.assert_allclose(test["r2"], r2_score(y.numpy(), z.numpy()), rtol=1e-5)
    group_b = table[(table["split"] == "test") & (table["data_group"] == "b")].iloc[0]
    np.testing.assert_allclose(group_b["mse"], float(nn.functional.mse_loss(z[1::2], y[1::2])), rtol=1e-6)
    assert group_b["n"] == 5
    summed = evaluate_regression(model, data, epoch=7, reduction="sum")
    np.testing.assert_allclose(summed["mean_loss"].iloc[0], 3 * test["mse"], rtol=1e-6)  # sum over 3 values


def test_regression_summary_over_indices(rng) -> None:
    from epochlens.evaluation import evaluate_regression, regression_summary

    data = regression_data(rng, d_out=1)
    data.train_labels, data.test_labels = data.train_labels[:, 0], data.test_labels[:, 0]
    tables = []
    for index in (0, 1, 2):
        torch.manual_seed(index)
        t = evaluate_regression(nn.Linear(5, 1), data, epoch=3)
        tables.append(t.assign(run="reg", index=index))
    summary = regression_summary(pd.concat(tables))
    row = summary[(summary["split"] == "test") & (summary["data_group"] == "all")].iloc[0]
    mses = [t[(t["split"] == "test") & (t["data_group"] == "all")]["mse"].iloc[0] for t in tables]
    assert row["n_indices"] == 3
    np.testing.assert_allclose(row["mse_mean"], np.mean(mses))
    np.testing.assert_allclose(row["mse_std"], np.std(mses, ddof=1))
