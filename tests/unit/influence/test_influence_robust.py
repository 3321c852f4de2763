"""Degenerate inputs and failure paths of the influence engine: finite, correct scores or clear errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from exact_influence import (
    MLP,
    LinearSoftmax,
    assert_matches,
    constant_output_linear,
    dampings_of,
    data,
    exact_scores,
    explicit_quantities,
)
from quality import SEED, above
from scipy.stats import spearmanr
from torch import nn

from epochlens.errors import ConfigError
from epochlens.influence import (
    DampingError,
    EigenError,
    FactorCacheError,
    InfluenceSettings,
    LayerSelectionError,
    damping_ladder,
    factor_cache_key,
    fit_factors,
    load_factors,
    load_or_fit_factors,
    pairwise_influence,
    save_factors,
    self_influence,
    symmetric_eigh,
)
from epochlens.influence import eigen as eigen_module
from epochlens.models.networks import SmallCNN

ACTIVE4 = np.arange(4)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _degenerate(kind: str, x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    if kind == "all_zero":
        return torch.zeros_like(x)
    if kind == "zero_column":
        x[:, 1] = 0.0
    elif kind == "constant_column":
        x[:, 2] = 3.0  # collinear with the bias column: A is singular
    elif kind == "duplicated":
        x[:, 3] = x[:, 0]
    elif kind == "scaled_1e4":
        x = x * 1e4
    return x


@pytest.mark.parametrize("kind", ["all_zero", "zero_column", "constant_column", "duplicated", "scaled_1e4"])
@pytest.mark.parametrize("method", ["ekfac", "kfac"])
def test_degenerate_features_give_exact_scores(kind, method) -> None:
    """Singular or badly scaled activation covariances: scores stay equal to the exact ones.

    Same exact setting as in test_influence_exact (constant output probabilities, so S ⊗ A is the
    GGN); the features make A singular (zero, constant or duplicated columns) or scale it by 1e8.
    """
    m = constant_output_linear(5, 4, seed=7)
    x, y = data(20, (5,), 4, 7)
    x = _degenerate(kind, x)
    settings = InfluenceSettings(method=method, fisher="expected", damping=1e-6)
    factors = fit_factors(m, x, y, ACTIVE4, settings)
    pair = pairwise_influence(m, factors, x, y, x[:4], y[:4], ACTIVE4, settings)
    selfs = self_influence(m, factors, x, y, ACTIVE4, settings)
    assert np.isfinite(pair.scores).all() and np.isfinite(selfs.scores).all()
    ex = explicit_quantities(m, x, y, ACTIVE4)
    exact_pair, exact_self = exact_scores(ex, dampings_of(pair.diagnostics))
    assert_matches(pair.scores, exact_pair[:4], rtol=1e-5)
    assert_matches(selfs.scores, exact_self, rtol=1e-5)
    if kind != "scaled_1e4":  # singular A: an eigenvalue that is zero up to rounding
        assert pair.diagnostics["min_eig"].iloc[0] <= 1e-12 * pair.diagnostics["max_eig"].iloc[0]
    assert np.isfinite(pair.diagnostics["cond"]).all()


def test_dead_relus_give_finite_scores_and_the_exact_diagonal() -> None:
    """Half of the hidden units never fire: zero rows/columns in S and A, still exact where it can be."""
    torch.manual_seed(8)
    m = MLP(4, 6, 4).double().eval()
    with torch.no_grad():
        m.fc1.bias[:3] = -100.0  # units 0-2 dead for every input
    x, y = data(16, (4,), 4, 8)
    for method in ("ekfac", "kfac", "diagonal"):
        settings = InfluenceSettings(method=method, fisher="expected", damping=1e-4)
        factors = fit_factors(m, x, y, ACTIVE4, settings)
        selfs = self_influence(m, factors, x, y, ACTIVE4, settings)
        assert np.isfinite(selfs.scores).all(), method
        assert (selfs.scores >= 0).all(), method
    # The diagonal method is exact for any network: compare it with the explicit GGN's diagonal.
    ex = explicit_quantities(m, x, y, ACTIVE4)
    damping = dampings_of(selfs.diagnostics)
    lam = torch.cat([torch.full((sl.stop - sl.start,), damping[n]) for n, sl in ex["slices"].items()])
    exact = (ex["grads"] ** 2 / (torch.diagonal(ex["ggn"]) + lam)).sum(1).numpy()
    np.testing.assert_allclose(selfs.scores, exact, rtol=1e-7)


def test_all_zero_images_leave_a_zero_curvature_layer_with_a_noted_damping() -> None:
    """A bias-free first convolution sees only zeros: its factors are zero, λ = 1 is noted, scores finite.

    Its gradients are all zero, so the scores equal those computed without that layer.
    """
    torch.manual_seed(9)
    m = SmallCNN(num_classes=4, in_channels=1).double().eval()
    x = torch.zeros(10, 1, 8, 8, dtype=torch.float64)
    y = np.arange(10) % 4
    settings = InfluenceSettings(method="ekfac", fisher="expected")
    factors = fit_factors(m, x, y, ACTIVE4, settings)
    selfs = self_influence(m, factors, x, y, ACTIVE4, settings)
    assert np.isfinite(selfs.scores).all()
    row = selfs.diagnostics.set_index("layer").loc["block1.0"]
    assert row["damping"] == 1.0 and "zero curvature" in row["note"]
    without = InfluenceSettings(method="ekfac", fisher="expected", exclude_layers=("block1.0",))
    f2 = fit_factors(m, x, y, ACTIVE4, without)
    np.testing.assert_allclose(selfs.scores, self_influence(m, f2, x, y, ACTIVE4, without).scores, rtol=1e-10)


def test_inputs_scaled_by_1e4_in_float32_give_the_same_scores() -> None:
    """Inputs x1e4 into a float32 CNN whose first BatchNorm absorbs the scale (as training would).

    The first convolution's A grows by 1e8 and its S shrinks by 1e-8; their Kronecker product,
    the gradients and the relative damping do not change, so neither may the scores. The scaled
    BatchNorm's eps is scaled with its variance (1e8 x), so that it absorbs the scale exactly (PyTorch
    2.11 refuses eps = 0, which this test set before).
    """
    torch.manual_seed(10)
    m = SmallCNN(num_classes=4, in_channels=1).eval()
    scaled = SmallCNN(num_classes=4, in_channels=1).eval()
    scaled.load_state_dict(m.state_dict())
    with torch.no_grad():
        scaled.block1[1].running_var.mul_(1e8)
        scaled.block1[1].eps = m.block1[1].eps * 1e8
    x = torch.randn(12, 1, 8, 8)
    y = np.arange(12) % 4
    settings = InfluenceSettings(method="ekfac")
    results = []
    for model, inputs in ((m, x), (scaled, x * 1e4)):
        factors = fit_factors(model, inputs, y, ACTIVE4, settings)
        results.append(pairwise_influence(model, factors, inputs, y, inputs[:3], y[:3], ACTIVE4, settings))
    assert np.isfinite(results[1].scores).all()
    np.testing.assert_allclose(results[1].scores, results[0].scores, rtol=1e-3)
    a0 = fit_factors(m, x, y, ACTIVE4, settings).layers["block1.0"].activation_cov
    a1 = fit_factors(scaled, x * 1e4, y, ACTIVE4, settings).layers["block1.0"].activation_cov
    torch.testing.assert_close(a1, a0 * 1e8, rtol=1e-5, atol=0)
    assert (results[1].diagnostics["damping_steps"] == 0).all()


@pytest.mark.quality
@pytest.mark.parametrize("compute_dtype", ["auto", "model"])
def test_half_precision_model(compute_dtype) -> None:
    """float16 weights: promoted to float32 by default (identical to the float32 copy); or run in half."""
    torch.manual_seed(11 + SEED)
    m16 = SmallCNN(num_classes=5, in_channels=1).eval().half()
    m32 = SmallCNN(num_classes=5, in_channels=1).eval()
    m32.load_state_dict({k: v.float() for k, v in m16.state_dict().items()})
    x = torch.randn(16, 1, 8, 8)
    y = np.arange(16) % 5
    active = np.arange(5)
    ref_settings = InfluenceSettings(method="kfac")
    ref = self_influence(m32, fit_factors(m32, x, y, active, ref_settings), x, y, active, ref_settings)
    settings = InfluenceSettings(method="kfac", compute_dtype=compute_dtype)
    factors = fit_factors(m16, x, y, active, settings)
    assert all(lf.activation_cov.dtype == torch.float64 for lf in factors.layers.values())
    got = self_influence(m16, factors, x, y, active, settings)
    assert np.isfinite(got.scores).all() and len(got.skipped) == 0
    if compute_dtype == "auto":
        np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-12)
    else:  # half-precision forward/backward: rounding of ~1e-3, same ranking
        np.testing.assert_allclose(got.scores, ref.scores, rtol=0.1)
        above(
            "float16 model: self-influence ρ against float32",
            spearmanr(got.scores, ref.scores).statistic,
            0.975,
        )


@pytest.mark.parametrize("method", ["ekfac", "diagonal", "identity"])
def test_one_nan_sample_is_left_out_and_reported(method) -> None:
    """A NaN image poisons nothing: its index is reported and every other score is unchanged."""
    torch.manual_seed(12)
    m = MLP(4, 6, 4).double().eval()
    x, y = data(15, (4,), 4, 12)
    bad = 6
    x_nan = x.clone()
    x_nan[bad, 2] = float("nan")
    settings = InfluenceSettings(method=method)  # true Fisher: draws keyed by sample index
    if method == "identity":  # no data pass
        factors = fit_factors(m, x_nan, y, ACTIVE4, settings)
    else:
        with pytest.warns(UserWarning, match=r"left out of the curvature factors: indices \[6\]"):
            factors = fit_factors(m, x_nan, y, ACTIVE4, settings)
    keep = np.delete(np.arange(15), bad)
    clean = fit_factors(m, x[keep], y[keep], ACTIVE4, settings, sample_indices=keep)
    if method != "identity":
        assert factors.skipped.tolist() == [bad] and factors.n_samples == 14
    selfs = _quiet(self_influence, m, factors, x_nan, y, ACTIVE4, settings)
    pair = _quiet(
        pairwise_influence,
        m,
        factors,
        x_nan,
        y,
        x_nan[4:8],
        y[4:8],
        ACTIVE4,
        settings,
        query_indices=np.arange(4, 8),
    )
    assert selfs.skipped.tolist() == [bad] and pair.train_skipped.tolist() == [bad]
    assert pair.query_skipped.tolist() == [bad]  # query 2 of 4..7 is sample 6
    assert (
        np.isnan(selfs.scores[bad]) and np.isnan(pair.scores[:, bad]).all() and np.isnan(pair.scores[2]).all()
    )
    ref_self = self_influence(m, clean, x[keep], y[keep], ACTIVE4, settings).scores
    np.testing.assert_allclose(selfs.scores[keep], ref_self, rtol=1e-10)
    assert np.isfinite(np.delete(pair.scores[[0, 1, 3]], bad, axis=1)).all()


def test_eigen_fallback_when_the_solver_fails(monkeypatch) -> None:
    """The LAPACK solver raising (as cusolver does) falls back to SciPy; scores are unchanged."""
    m = constant_output_linear(4, 3, seed=13)
    x, y = data(12, (4,), 3, 13)
    active = np.arange(3)
    settings = InfluenceSettings(method="kfac", fisher="expected")
    ref = self_influence(m, fit_factors(m, x, y, active, settings), x, y, active, settings)

    def failing(matrix):
        raise torch.linalg.LinAlgError("simulated: the algorithm failed to converge")

    monkeypatch.setattr(eigen_module, "_torch_eigh", failing)
    with pytest.warns(UserWarning, match="fell back to cpu-scipy-evr"):
        factors = fit_factors(m, x, y, active, settings)
    got = self_influence(m, factors, x, y, active, settings)
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-9)
    assert "A: cpu-scipy-evr <- cpu: _LinAlgError: simulated" in got.diagnostics["solver"].iloc[0]


def test_eigen_device_failure_and_size_limit_fall_back_to_the_cpu() -> None:
    a = torch.randn(6, 4, dtype=torch.float64)
    matrix = a @ a.T  # rank 4: two zero eigenvalues, possibly slightly negative after rounding
    big = symmetric_eigh(matrix, "layer 'x': A", device="cuda", max_device_dim=3)
    assert big.solver.startswith("cpu <- cuda: dim 6 > max_device_eigh_dim 3")
    if not torch.cuda.is_available():  # the device solve itself fails: falls back, with a warning
        with pytest.warns(UserWarning, match="fell back to cpu"):
            e = symmetric_eigh(matrix, "layer 'x': A", device="cuda")
        assert e.solver.startswith("cpu <- cuda")
    e = symmetric_eigh(matrix, "layer 'x': A")
    assert (e.values >= 0).all() and e.min_raw < 1e-12
    torch.testing.assert_close(e.vectors @ torch.diag(e.values) @ e.vectors.T, matrix, atol=1e-10, rtol=0)


def test_eigen_refuses_nan_factors_naming_the_layer() -> None:
    matrix = torch.eye(3, dtype=torch.float64)
    matrix[1, 2] = float("nan")
    with pytest.raises(EigenError, match=r"layer 'block3\.0': activation covariance A \(3x3\) holds 1 NaN"):
        symmetric_eigh(matrix, "layer 'block3.0': activation covariance A")


def test_zero_and_underflowing_damping_are_refused() -> None:
    with pytest.raises(ConfigError, match="damping=0.0 is refused"):
        InfluenceSettings(damping=0.0)
    with pytest.raises(ConfigError, match="damping=nan is refused"):
        InfluenceSettings(damping=float("nan"))
    m = constant_output_linear(4, 3, seed=14)
    x, y = data(10, (4,), 3, 14)
    active = np.arange(3)
    factors = fit_factors(m, x, y, active, InfluenceSettings(method="ekfac"))
    tiny = InfluenceSettings(method="ekfac", damping=1e-300)
    with pytest.raises(DampingError, match=r"layer 'fc': damping .* underflows.*Use influence damping >="):
        self_influence(m, factors, x, y, active, tiny)
    with pytest.raises(DampingError, match="layer 'fc'"):
        self_influence(m, factors, x, y, active, InfluenceSettings(damping=1e-30, damping_mode="absolute"))


def test_damping_ladder_raises_damping_until_the_solve_is_finite() -> None:
    eig = torch.tensor([0.0, 1e-50, 1.0], dtype=torch.float64)
    done = damping_ladder(eig, 1e-45, "fc", dtype=torch.float32, growth=10.0)
    assert done.steps > 0 and done.damping >= 1 / torch.finfo(torch.float32).max
    assert torch.isfinite(done.inverse.float()).all() and "raised" in done.note
    assert damping_ladder(eig, 1e-45, "fc", dtype=torch.float64).steps == 0
    with pytest.raises(DampingError, match="layer 'fc'"):
        damping_ladder(eig, 1e-45, "fc", dtype=torch.float32, max_steps=2)


def test_ladder_in_float32_solves_of_tiny_curvature() -> None:
    """Inputs of 1e-22 to a bias-free layer: eigenvalues ~1e-45, whose inverse overflows float32."""
    torch.manual_seed(15)
    m = nn.Sequential(nn.Flatten(), nn.Linear(4, 3, bias=False)).double().eval()
    x, y = data(12, (4,), 3, 15)
    x = x * 1e-22
    active = np.arange(3)
    settings = InfluenceSettings(method="kfac", fisher="expected", damping=1e-8, precondition_dtype="float32")
    factors = fit_factors(m, x, y, active, settings)
    selfs = self_influence(m, factors, x, y, active, settings)
    assert selfs.diagnostics["damping_steps"].iloc[0] > 0
    assert np.isfinite(selfs.scores).all() and (selfs.scores >= 0).all()


def test_factor_cache_roundtrip_and_key_checks(tmp_path) -> None:
    m = MLP(3, 5, 4).double().eval()
    x, y = data(12, (3,), 4, 16)
    settings = InfluenceSettings(method="ekfac")
    path = tmp_path / "factors.pt"
    factors, reused = load_or_fit_factors(path, m, x, y, ACTIVE4, settings)
    assert not reused and path.is_file()
    again, reused = load_or_fit_factors(path, m, x, y, ACTIVE4, settings)
    assert reused
    # The same factors serve pairwise and self-influence, and any damping.
    for damping in (0.1, 1e-3):
        s = InfluenceSettings(method="ekfac", damping=damping)
        a = self_influence(m, factors, x, y, ACTIVE4, s).scores
        b = self_influence(m, again, x, y, ACTIVE4, s).scores
        np.testing.assert_allclose(a, b, rtol=1e-13)
    key = factor_cache_key(m, x, y, ACTIVE4, settings)
    assert load_factors(path, key).key == key
    other = factor_cache_key(m, x[:-1], y[:-1], ACTIVE4, InfluenceSettings(method="kfac"))
    with pytest.raises(
        FactorCacheError, match=r"factors\.pt: factors were fitted for other inputs \(data: .*settings"
    ):
        load_factors(path, other)
    path.write_bytes(b"truncated")
    with pytest.raises(FactorCacheError, match="not a readable epochlens factors file"):
        load_factors(path)
    assert again.layers["fc1"].activation_cov is None  # by default only the eigenpairs are kept
    assert again.fit_settings == factors.fit_settings == settings.factor_key()
    save_factors(path, factors, include_covariances=True)
    torch.testing.assert_close(
        load_factors(path).layers["fc1"].activation_cov, factors.layers["fc1"].activation_cov
    )
    # A refit on a key mismatch overwrites the file.
    _, reused = load_or_fit_factors(path, m, x[:-1], y[:-1], ACTIVE4, settings)
    assert not reused and load_factors(path).n_samples == 11


def test_scores_do_not_depend_on_batch_sizes() -> None:
    m = MLP(3, 5, 4).double().eval()
    x, y = data(13, (3,), 4, 17)
    a = InfluenceSettings(factor_batch_size=4, train_batch_size=3, query_batch_size=2)
    b = InfluenceSettings(factor_batch_size=64, train_batch_size=64, query_batch_size=64)
    pa = pairwise_influence(m, fit_factors(m, x, y, ACTIVE4, a), x, y, x[:5], y[:5], ACTIVE4, a)
    pb = pairwise_influence(m, fit_factors(m, x, y, ACTIVE4, b), x, y, x[:5], y[:5], ACTIVE4, b)
    np.testing.assert_allclose(pa.scores, pb.scores, rtol=1e-10)


def test_layer_selection_errors_and_inactive_labels() -> None:
    m = MLP(3, 5, 4).double().eval()
    x, y = data(8, (3,), 4, 18)
    only = InfluenceSettings(method="kfac", layers=("fc2",))
    factors = fit_factors(m, x, y, ACTIVE4, only)
    assert list(factors.layers) == ["fc2"]
    # Without settings, scores use the factors' own (layers included), with default damping.
    selfs = self_influence(m, factors, x, y, ACTIVE4)
    same = self_influence(m, factors, x, y, ACTIVE4, factors.settings(damping=0.1))
    np.testing.assert_array_equal(selfs.scores, same.scores)
    assert list(selfs.diagnostics["layer"]) == ["fc2"]
    with pytest.raises(
        LayerSelectionError, match=r"'conv\*' matches no Linear/Conv2d module.*\['fc1', 'fc2'\]"
    ):
        fit_factors(m, x, y, ACTIVE4, InfluenceSettings(layers=("conv*",)))
    with pytest.raises(FactorCacheError, match="fitted on layers"):
        self_influence(m, factors, x, y, ACTIVE4, InfluenceSettings(method="kfac"))
    # ReLU(inplace=True) after a tracked layer is supported: see test_influence_modules.py.
    # Samples whose label is not an active class are not scored (NaN), and not reported as bad.
    active = np.array([0, 1])
    selfs = self_influence(m, None, x, y, active, InfluenceSettings(method="identity"))
    assert np.isnan(selfs.scores[y >= 2]).all() and np.isfinite(selfs.scores[y < 2]).all()
    assert len(selfs.skipped) == 0


def test_nan_weights_are_refused() -> None:
    m = LinearSoftmax(3, 4).double()
    with torch.no_grad():
        m.fc.weight[0, 0] = float("nan")
    x, y = data(4, (3,), 4, 19)
    with pytest.raises(Exception, match=r"NaN or Inf in \['fc.weight'\]"):
        fit_factors(m, x, y, ACTIVE4, InfluenceSettings())
