"""Factors fitted and scored a layer group at a time (epochlens.influence.factor_groups): the groups
a budget makes, the grouped file, and scores that add up over the groups to the exact ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_influence import (
    assert_matches,
    constant_output_mlp,
    dampings_of,
    data,
    exact_scores,
    explicit_quantities,
)
from torch import nn

from epochlens.errors import FactorCacheError
from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    select_layers,
    self_influence,
)
from epochlens.influence.factor_groups import (
    factor_groups,
    group_names,
    group_settings,
    layer_bytes,
    merged_groups,
    plan_groups,
    save_factor_groups,
)


def test_a_budget_cuts_the_layers_in_module_order_and_a_large_layer_stands_alone() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 400), nn.Linear(400, 10))
    layers = select_layers(model)
    small = layer_bytes(layers["0"], "ekfac")  # 8 x (3 (11² + 10²) + 2 x 10 x 11)
    assert small == 8 * (3 * (11**2 + 10**2) + 2 * 10 * 11)
    budget = 2.5 * small / 2**30
    assert plan_groups(layers, "ekfac", budget) == [["0", "1"], ["2"], ["3"]]
    assert plan_groups(layers, "ekfac", 1.0) == [["0", "1", "2", "3"]]
    assert plan_groups(layers, "identity", 1e-12) == [["0", "1", "2", "3"]]  # no factors
    assert layer_bytes(layers["0"], "diagonal") == 8 * 2 * 10 * 11


@pytest.mark.parametrize("method", ["ekfac", "kfac", "diagonal"])
def test_scores_summed_over_layer_groups_are_the_exact_and_the_whole_models(method, tmp_path) -> None:
    """One group per layer, written to a grouped file and read back a group at a time: the summed
    scores equal the ungrouped fit's (the same per-layer sums) and, for K-FAC and EK-FAC, the
    exact block-diagonal GGN's of this MLP (exact per layer: tests/unit/influence/
    test_influence_exact.py)."""
    m = constant_output_mlp(3, seed=2)
    x, y = data(30, (3,), 4, 2)
    active = np.arange(4)
    settings = InfluenceSettings(method=method, fisher="expected", damping=1e-8)
    whole = fit_factors(m, x, y, active, settings, key={"run": "a"})
    names = plan_groups(select_layers(m), method, 1e-12)
    assert names == [["fc1"], ["fc2"]]
    fitted = (fit_factors(m, x, y, active, group_settings(settings, g), key={"run": "a"}) for g in names)
    path = tmp_path / "factors.pt"
    save_factor_groups(path, fitted, names, {"run": "a"})
    assert group_names(path) == names
    pair, selfs, diagnostics = 0.0, 0.0, []
    for factors in factor_groups(path, expected_key={"run": "a"}):
        spec = group_settings(settings, list(factors.layers))
        p = pairwise_influence(m, factors, x, y, x[:5], y[:5], active, spec)
        pair, selfs = pair + p.scores, selfs + self_influence(m, factors, x, y, active, spec).scores
        diagnostics.append(p.diagnostics)
    ref_pair = pairwise_influence(m, whole, x, y, x[:5], y[:5], active, settings)
    ref_self = self_influence(m, whole, x, y, active, settings).scores
    np.testing.assert_allclose(pair, ref_pair.scores, rtol=1e-12, atol=1e-12 * np.abs(ref_pair.scores).max())
    np.testing.assert_allclose(selfs, ref_self, rtol=1e-12, atol=1e-12 * np.abs(ref_self).max())
    merged = merged_groups(factor_groups(path))
    for name, lf in whole.layers.items():
        got = merged.layers[name].eigenvalues(method)
        assert torch.equal(got, lf.eigenvalues(method)), name
    if method != "diagonal":
        ex = explicit_quantities(m, x, y, active)
        dampings = {k: v for d in diagnostics for k, v in dampings_of(d).items()}
        exact_pair, exact_self = exact_scores(ex, dampings)
        assert_matches(pair, exact_pair[:5])
        assert_matches(selfs, exact_self)


def test_the_grouped_file_is_the_same_bytes_for_the_same_factors_and_checks_its_key(tmp_path) -> None:
    m = constant_output_mlp(3, seed=2)
    x, y = data(20, (3,), 4, 3)
    settings = InfluenceSettings(method="kfac", fisher="expected")
    names = [["fc1"], ["fc2"]]
    groups = [fit_factors(m, x, y, np.arange(4), group_settings(settings, g), key={"k": 1}) for g in names]
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    save_factor_groups(first, iter(groups), names, {"k": 1})
    save_factor_groups(second, iter(groups), names, {"k": 1})
    assert first.read_bytes() == second.read_bytes()
    with pytest.raises(FactorCacheError, match="a.pt"):
        next(factor_groups(first, expected_key={"k": 2}))
    with pytest.raises(ValueError, match="planned"):
        save_factor_groups(tmp_path / "c.pt", iter(groups[::-1]), names, {"k": 1})
    one = tmp_path / "one.pt"  # one group: the plain factors file
    save_factor_groups(
        one, iter([fit_factors(m, x, y, np.arange(4), settings, key={"k": 1})]), [["fc1", "fc2"]], {}
    )
    assert group_names(one) is None and [list(f.layers) for f in factor_groups(one)] == [["fc1", "fc2"]]


def test_a_written_group_is_not_held_while_the_next_is_fitted(tmp_path) -> None:
    """save_factor_groups drops each group once written: a job holds one group's factors, not two
    (a 7B layer's are ~4.5 GB)."""
    import gc
    import weakref

    m = constant_output_mlp(3, seed=2)
    x, y = data(30, (3,), 4, 2)
    settings = InfluenceSettings(method="ekfac", fisher="expected")
    names = [[n] for n in select_layers(m)]
    held = []

    def groups():
        for group in names:
            gc.collect()
            held.append(sum(ref() is not None for ref in refs))  # earlier groups still alive
            factors = fit_factors(m, x, y, np.arange(4), group_settings(settings, group), key={})
            refs.append(weakref.ref(factors))
            yield factors
            del factors

    refs: list = []
    save_factor_groups(tmp_path / "factors.pt", groups(), names, {})
    assert len(names) == 2 and held == [0, 0]
