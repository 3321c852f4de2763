"""trak's projection of the whole gradient (a count sketch) against exact answers: where nothing is
projected, the scores are exact influence with the whole Gauss-Newton matrix (every layer together,
not block-diagonal); with the sketch, the error of gradient inner products falls as 1/√k
(Johnson-Lindenstrauss); the sketch is a pure function of seed and layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_influence import (
    MLP,
    TinyCNN,
    assert_matches,
    data,
    exact_scores,
    explicit_quantities,
    projected_rows,
    projection_errors,
)

from epochlens.influence import InfluenceSettings
from epochlens.influence.covariances import resolve_layers
from epochlens.influence.projected_basis import projected_basis
from epochlens.influence.projected_curvature import projected_curvature
from epochlens.influence.projection import projection_pass
from epochlens.influence.projection_settings import ProjectionSettings, projection_settings
from epochlens.influence.whole_projection import WHOLE, WholePass, layer_sketches


def test_trak_selects_the_whole_projection():
    assert projection_settings({"trak_dim": 64}, 3, "trak") == ProjectionSettings(
        trak_dim=64, seed=3, whole=True
    )
    assert projection_pass(projection_settings({}, 0, "trak")) is WholePass
    assert not projection_settings({}, 0, "logra").whole
    assert projection_settings({"trak_dim": 64}, 0, "trak").store_key() == {
        "dim": 64, "dtype": "float32", "seed": 0, "whole": True,
    }  # fmt: skip
    assert projection_settings({"trak_dim": 64}, 0, "logra").store_key() == {
        "dim": 32,
        "dtype": "float32",
        "seed": 0,
    }


@pytest.mark.parametrize(
    ("model", "shape", "classes"),
    [(lambda: MLP(5, 4, 3), (5,), 3), (lambda: TinyCNN(3), (2, 6, 6), 3)],
    ids=["mlp", "cnn"],
)
def test_identity_is_exact_influence_with_the_whole_gauss_newton_matrix(model, shape, classes):
    """k >= p: g_qᵀ (GGN + λI)⁻¹ g_n with the explicit GGN of every tracked parameter (off-diagonal
    blocks between layers included, unlike logra's), λ the relative damping of its mean eigenvalue."""
    torch.manual_seed(0)
    net = model().double().eval()
    x, y = data(16, shape, classes, 1)
    active = np.arange(classes)
    settings = InfluenceSettings(method="identity", fisher="expected", damping=0.1)
    out, result, layout = projected_rows(
        net, x, y, active, settings, ProjectionSettings(trak_dim=10**6, whole=True)
    )
    ex = explicit_quantities(net, x, y, active)
    p = ex["grads"].shape[1]
    assert layout == [[WHOLE, 1, p, 1, p, 0]]
    curvature = projected_curvature(
        projected_basis(result.fisher, result.n_fisher, layout, "gauss_newton"), settings
    )
    (lam,) = curvature.diagnostics["damping"]
    assert lam == pytest.approx(0.1 * np.trace(ex["ggn"].numpy()) / p, rel=1e-9)
    exact_pair, exact_self = exact_scores(ex, dict.fromkeys(ex["slices"], lam), block_diagonal=False)
    pair = curvature.apply(out) @ out.T
    assert_matches(pair, exact_pair, rtol=1e-9)
    assert_matches(np.diag(pair), exact_self, rtol=1e-9)
    block, _ = exact_scores(ex, dict.fromkeys(ex["slices"], lam), block_diagonal=True)
    assert np.abs(block - exact_pair).max() > 1e-3 * np.abs(exact_pair).max()  # the layers' coupling counts


def test_sketch_error_falls_as_one_over_root_k():
    """The sketch's inner products approach the exact ones: relative error (mean over 8 seeds) falling
    as k^-1/2, as a Gaussian projection's."""
    dims = (16, 64, 256, 1024)
    errors, slope = projection_errors(
        lambda k, seed: ProjectionSettings(trak_dim=k, precondition="none", seed=seed, whole=True), dims
    )
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False)), errors
    assert -0.75 < slope < -0.3, (slope, errors)
    assert errors[-1] < 0.25


def test_sketch_is_drawn_from_seed_and_layer():
    net = MLP(6, 5, 4).double()
    layers = resolve_layers(net, InfluenceSettings(method="identity"))
    a, b = (layer_sketches(layers, ProjectionSettings(trak_dim=8, seed=3)) for _ in range(2))
    c = layer_sketches(layers, ProjectionSettings(trak_dim=8, seed=4))
    for name in layers:
        assert torch.equal(a[name].columns, b[name].columns) and torch.equal(a[name].signs, b[name].signs)
        assert a[name].columns.min() >= 0 and a[name].columns.max() < 8 and a[name].size == 8
        assert set(a[name].signs.tolist()) == {-1, 1}
    assert any(not torch.equal(a[n].columns, c[n].columns) for n in layers)
    first, second = list(a.values())
    assert not torch.equal(first.columns[:20], second.columns[:20])  # each layer its own draw
