"""Unit tests of unit-group ablations on cases with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from quality import SEED, above

from epochlens.ablation.ablate import UnitGroup, ablated, ablation_table, channel_ranges, unit_groups
from epochlens.ablation.settings import AblationSettings
from epochlens.errors import ConfigError, LayerError
from epochlens.models.networks import ResNet18LoP, SmallCNN, restrict_logits

ACTIVE = np.array([2, 0, 1])  # class-order positions: class 2 first
NEW = np.array([1])  # the current task's class; 2 and 0 are old


def stripes(n: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """1x8x8 images of 4 classes: class c has a bright band in rows 2c..2c+1, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 4
    x = 0.3 * torch.randn(n, 1, 8, 8, generator=gen)
    for c in range(4):
        x[labels == c, :, 2 * c : 2 * c + 2, :] += 2.0
    return x, labels.numpy()


@pytest.fixture(scope="module")
def trained() -> tuple[SmallCNN, torch.Tensor, np.ndarray]:
    """A SmallCNN trained on the active classes (a second of Adam), with known dead/constant units.

    * fc ignores block3 channels 0..15 (zero weights): the output does not depend on them;
    * block2 channels 0..7 are constant 0.7 (BatchNorm scale 0, shift 0.7, then ReLU);
    * block1 channels 0..3 are always 0 (BatchNorm scale 0, shift -1, then ReLU).
    """
    torch.manual_seed(SEED)
    model = SmallCNN(num_classes=4, in_channels=1)
    x, y = stripes(240, seed=2 * SEED)
    keep = np.isin(y, ACTIVE)
    xa = x[keep]
    target = torch.as_tensor([int(np.flatnonzero(ACTIVE == c)[0]) for c in y[keep]])
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(25):
        opt.zero_grad()
        F.cross_entropy(restrict_logits(model(xa), ACTIVE), target).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        model.fc.weight[:, :16] = 0
        model.block2[1].weight[:8] = 0
        model.block2[1].bias[:8] = 0.7
        model.block1[1].weight[:4] = 0
        model.block1[1].bias[:4] = -1.0
    x_eval, y_eval = stripes(120, seed=2 * SEED + 1)
    return model, x_eval, y_eval


def _row(table, block: str, group: str, mode: str, cohort: str = "all"):
    sel = table[
        (table["block"] == block)
        & (table["group"] == group)
        & (table["mode"] == mode)
        & (table["cohort"] == cohort)
    ]
    assert len(sel) == 1
    return sel.iloc[0]


def test_channel_ranges_and_unit_groups() -> None:
    assert channel_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert channel_ranges(3, 8) == [(0, 1), (1, 2), (2, 3)]
    assert channel_ranges(5, 0) == []
    groups = unit_groups(SmallCNN(4, 1), torch.zeros(1, 1, 8, 8), AblationSettings(channel_groups=2))
    assert groups[:3] == [
        UnitGroup("block1", "all", 0, 16),
        UnitGroup("block1", "ch0-7", 0, 8),
        UnitGroup("block1", "ch8-15", 8, 16),
    ]
    assert len(groups) == 9 and groups[-1] == UnitGroup("block3", "ch32-63", 32, 64)
    resnet = unit_groups(ResNet18LoP(4), torch.zeros(1, 3, 8, 8), AblationSettings(channel_groups=0))
    assert [g.block for g in resnet] == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert resnet[-1].n_channels == 512


@pytest.mark.quality
def test_units_the_output_ignores_change_nothing(trained) -> None:
    model, x, y = trained
    settings = AblationSettings(blocks=["block1", "block2", "block3"], channel_groups=4)
    table = ablation_table(model, x, y, ACTIVE, NEW, settings, context={"epoch": 3})
    assert table.columns[0] == "epoch" and set(table.cohort) == {"old", "new", "all"}
    assert (table.n_samples[table.cohort == "all"] == 90).all()  # class 3 is inactive: left out
    assert (table.n_samples[table.cohort == "new"] == 30).all()
    base = _row(table, "block3", "all", "zero")
    above("accuracy of the trained SmallCNN on stripes", base.accuracy_base, 0.9)  # it learned the task
    # fc ignores block3 channels 0..15: ablating them changes nothing, exactly.
    for mode in ("zero", "mean"):
        for cohort in ("old", "new", "all"):
            r = _row(table, "block3", "ch0-15", mode, cohort)
            assert r.delta_accuracy == 0.0 and r.delta_loss == 0.0
    # block1 channels 0..3 are always zero: zeroing them changes nothing.
    r = _row(table, "block1", "ch0-3", "zero")
    assert r.delta_accuracy == 0.0 and r.delta_loss == 0.0
    # block2 channels 0..7 are constant: replacing them by their mean changes nothing, zeroing does.
    r = _row(table, "block2", "ch0-7", "mean")
    assert r.delta_accuracy == 0.0 and r.delta_loss == 0.0
    assert _row(table, "block2", "ch0-7", "zero").delta_loss != 0.0


def test_ablating_what_matters_changes_accuracy(trained) -> None:
    model, x, y = trained
    table = ablation_table(model, x, y, ACTIVE, NEW, AblationSettings(channel_groups=0, modes=("zero",)))
    assert set(table.group) == {"all"} and set(table.block) == {"block1", "block2", "block3"}
    whole = _row(table, "block3", "all", "zero")
    # Without block3 the logits are fc's bias: one class for every image, at most 1/3 of them right.
    assert whole.accuracy <= 1 / 3 + 1e-9 and whole.delta_accuracy < -0.5 and whole.delta_loss > 0
    new, old = _row(table, "block3", "all", "zero", "new"), _row(table, "block3", "all", "zero", "old")
    assert {new.accuracy, old.accuracy} <= {0.0, 0.5, 1.0}  # a constant prediction per cohort


def test_ablation_hook_is_removed_and_model_untouched(trained) -> None:
    model, x, _ = trained
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        before = model(x)
        with ablated(model, UnitGroup("block3", "all", 0, 64), "zero"):
            during = model(x)
        after = model(x)
    torch.testing.assert_close(during, model.fc.bias.expand_as(during))
    torch.testing.assert_close(before, after, rtol=0, atol=0)
    ablation_table(model, x, np.zeros(len(x), dtype=np.int64), ACTIVE, NEW, AblationSettings(modes=("zero",)))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)


def test_the_ablations_run_on_the_model_itself_and_leave_it_as_it_was(trained) -> None:
    """No copy of the weights (a 7B model's would take 29 GB more): the forward passes run on the
    caller's modules, whose training flags and requires_grad are put back afterwards."""
    model, x, _ = trained
    model.train()
    ran_on = set()
    handle = model.fc.register_forward_hook(lambda module, *_: ran_on.add(module is model.fc))
    try:
        ablation_table(
            model, x, np.zeros(len(x), dtype=np.int64), ACTIVE, NEW, AblationSettings(modes=("zero",))
        )
    finally:
        handle.remove()
        training = model.training
        model.eval()
    assert ran_on == {True}
    assert training and all(p.requires_grad for p in model.parameters())


def test_bad_inputs_are_named(trained) -> None:
    model, x, y = trained
    with pytest.raises(LayerError, match=r"no layer\(s\) \['block7'\]. Available layers"):
        ablation_table(model, x, y, ACTIVE, NEW, AblationSettings(blocks=["block7"]))
    with pytest.raises(ConfigError, match=r"new classes \[3\]"):
        ablation_table(model, x, y, ACTIVE, np.array([3]))
    with pytest.raises(ConfigError, match="modes"):
        AblationSettings(modes=("shuffle",))
    with pytest.raises(ConfigError, match="no evaluation image"):
        ablation_table(model, x[y == 3], y[y == 3], ACTIVE, NEW)


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_16_bit_ablations_are_close_to_float32_and_computed_in_16_bit(trained, precision) -> None:
    """ablation.precision: the same table from autocast forward passes: losses within ~1e-2 nats of
    float32's (what 8 or 11 mantissa bits allow), and not identical (the passes did run in 16 bit)."""
    model, x, y = trained
    settings = dict(channel_groups=2, modes=("zero", "mean"))
    full = ablation_table(model, x, y, ACTIVE, NEW, AblationSettings(**settings))
    half = ablation_table(model, x, y, ACTIVE, NEW, AblationSettings(**settings, precision=precision))
    assert half[["block", "group", "mode", "cohort"]].equals(full[["block", "group", "mode", "cohort"]])
    np.testing.assert_allclose(half["loss"], full["loss"], atol=0.03)
    np.testing.assert_allclose(half["delta_loss"], full["delta_loss"], atol=0.03)
    assert not np.array_equal(half["loss"], full["loss"])
    with pytest.raises(ConfigError, match="precision='float8'"):
        AblationSettings(precision="float8")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_regression_ablation_changes_the_squared_error_of_every_sample(reduction) -> None:
    """Zeroing a hidden group of an MLP regression: the table's loss is the mean squared error of
    the ablated network computed here by hand; one cohort (all samples), no accuracy columns."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential()
    net.add_module("hidden", nn.Sequential(nn.Linear(5, 6), nn.Tanh()))
    net.add_module("head", nn.Linear(6, 3))
    x = torch.randn(20, 5)
    y = torch.randn(20, 3).numpy()
    settings = AblationSettings(blocks=["hidden"], channel_groups=2, modes=["zero"])
    table = ablation_table(
        net, x, y, np.zeros(1, np.int64), np.zeros(1, np.int64), settings, reduction=reduction
    )
    assert set(table["cohort"]) == {"all"} and "accuracy" not in table and "delta_accuracy" not in table
    with torch.no_grad():
        h = net.hidden(x)
        h[:, :3] = 0  # group ch0-2
        err = (net.head(h) - torch.as_tensor(y)) ** 2
        base = (net(x) - torch.as_tensor(y)) ** 2
    reduce = (lambda e: e.mean(1)) if reduction == "mean" else (lambda e: e.sum(1))
    row = _row(table, "hidden", "ch0-2", "zero")
    np.testing.assert_allclose(row["loss"], float(reduce(err).mean()), rtol=1e-6)
    np.testing.assert_allclose(row["loss_base"], float(reduce(base).mean()), rtol=1e-6)
    np.testing.assert_allclose(row["delta_loss"], row["loss"] - row["loss_base"], rtol=1e-9)


def test_the_units_in_parts_make_the_whole_table(trained, tmp_path) -> None:
    """ablation.parts: each part a contiguous block of the unit groups; their tables, written and
    read back as the workflow merges them, are the one job's table (same rows, same numbers)."""
    import pandas as pd

    model, x, y = trained
    whole = ablation_table(model, x, y, ACTIVE, NEW, AblationSettings(channel_groups=2, batch_size=50))
    paths = []
    for k in range(3):
        settings = AblationSettings(channel_groups=2, batch_size=50, part=k, parts=3)
        ablation_table(model, x, y, ACTIVE, NEW, settings).to_csv(tmp_path / f"{k}.csv", index=False)
        paths.append(tmp_path / f"{k}.csv")
    merged = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    pd.testing.assert_frame_equal(merged, whole, check_exact=True)
    assert len({tuple(pd.read_csv(p)["block"].unique()) for p in paths}) == 3  # different blocks
    n = len(unit_groups(model, x[:1], AblationSettings(channel_groups=2)))
    with pytest.raises(ConfigError, match=f"ablation.parts={n + 1} is more than the {n} unit groups"):
        unit_groups(model, x[:1], AblationSettings(channel_groups=2, part=0, parts=n + 1))
    with pytest.raises(ConfigError, match="part 3 of parts=3"):
        AblationSettings(part=3, parts=3)
