"""Numerics in reduced precision and at scale: underflow, conditioning against the forward dtype, and
pairwise scoring with the training gradients computed once for all queries."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from exact_influence import MLP, LinearSoftmax, TinyCNN, data
from quality import SEED, above, at_most
from scipy.stats import spearmanr
from torch import nn

from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    per_sample_gradients,
    self_influence,
)

ACTIVE = np.arange(3)


def _supported(dtype: torch.dtype) -> bool:
    try:
        w = torch.ones(3, 2, dtype=dtype, requires_grad=True)
        (torch.ones(4, 3, dtype=dtype) @ w).sum().backward()
        return True
    except RuntimeError:
        return False


HALF = [
    pytest.param(d, marks=pytest.mark.skipif(not _supported(d), reason=f"{d} unsupported"))
    for d in (torch.float16, torch.bfloat16)
]


def _confident_linear(seed: int) -> LinearSoftmax:
    """Logit gaps of ~20-40: p − e_y of the labelled class is ~1e-9..1e-17, below float16's 6e-8."""
    g = torch.Generator().manual_seed(seed)
    m = LinearSoftmax(4, 3)
    with torch.no_grad():
        m.fc.weight.copy_(torch.randn(3, 4, generator=g) * 8)
        m.fc.bias.zero_()
    return m.eval()


@pytest.mark.quality
@pytest.mark.parametrize("dtype", HALF)
def test_confident_samples_in_half_precision_get_their_scores_not_zero(dtype) -> None:
    """fp16/bf16 forward and backward of confident samples: scores match float64, none is 0.

    The loss gradient p − e_y (~1e-9) is computed in float64 and scaled per sample by a power of two
    before the half-precision backward, then scaled back: without it, it rounds to 0 in float16
    and the sample's self-influence would be exactly 0.
    """
    m = _confident_linear(80 + SEED).to(dtype)
    ref = LinearSoftmax(4, 3).double().eval()
    ref.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    x, _ = data(20, (4,), 3, 80 + SEED)
    x = x.to(dtype).double()  # representable in the half type: both models see the same inputs
    y = ref(x).argmax(1).numpy()  # the predicted class: confident, tiny gradients
    settings = InfluenceSettings(method="identity", compute_dtype="model")
    got = self_influence(m, None, x, y, ACTIVE, settings)
    want = self_influence(ref, None, x, y, ACTIVE, InfluenceSettings(method="identity"))
    assert want.scores.min() < 1e-14  # these gradients are far below float16's range
    assert (got.scores > 0).all() and len(got.underflow) == 0
    # Within the forward's rounding (logit gaps of ~30 carry bfloat16's 3 digits into p): scores
    # spanning 30 orders of magnitude agree to ~7% (float16) / ~30% (bfloat16).
    tol = 0.03 if dtype == torch.float16 else 0.3  # measured over 10 draws: 0.018 and 0.17 at most
    error = np.abs(np.log10(got.scores) - np.log10(want.scores)).max()
    at_most("largest |log10 score - log10 float64 score|", error, tol)
    above("self-influence ρ against float64", spearmanr(got.scores, want.scores).statistic, 0.99)


@pytest.mark.parametrize("dtype", HALF)
def test_gradients_that_underflow_are_flagged_not_zero(dtype) -> None:
    """A sample whose inputs round to 0 in the compute dtype has a vanished gradient: NaN, reported.

    Sample 3's inputs (1e-9 for float16, 1e-42 for bfloat16) are representable in float32, where
    its gradient and score are non-zero, but round to zero in the half type. Every other score is
    unaffected; the factors leave the sample out and list it.
    """
    tiny = 1e-9 if dtype == torch.float16 else 1e-42
    torch.manual_seed(81)
    m = nn.Sequential(nn.Linear(4, 3, bias=False)).eval()
    x, y = data(8, (4,), 3, 81)
    x = x.float()
    x[3] = tiny
    ref = self_influence(m, None, x, y, ACTIVE, InfluenceSettings(method="identity"))
    assert ref.scores[3] > 0
    half = nn.Sequential(nn.Linear(4, 3, bias=False)).eval().to(dtype)
    half.load_state_dict({k: v.to(dtype) for k, v in m.state_dict().items()})
    settings = InfluenceSettings(method="kfac", compute_dtype="model", fisher="empirical")
    with pytest.warns(UserWarning, match=r"gradients all vanished in (float16|bfloat16).*indices \[3\]"):
        factors = fit_factors(half, x, y, ACTIVE, settings)
    assert factors.underflow.tolist() == [3] and factors.n_samples == 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = self_influence(half, factors, x, y, ACTIVE, settings)
        pair = pairwise_influence(
            half, factors, x, y, x[2:5], y[2:5], ACTIVE, settings, query_indices=[2, 3, 4]
        )
    assert np.isnan(got.scores[3]) and got.underflow.tolist() == [3] and len(got.skipped) == 0
    assert np.isfinite(np.delete(got.scores, 3)).all()
    assert pair.train_underflow.tolist() == [3] and pair.query_underflow.tolist() == [3]
    assert np.isnan(pair.scores[1]).all() and np.isnan(pair.scores[:, 3]).all()
    assert np.isfinite(pair.scores[[0, 2]][:, [0, 1, 2, 4, 5, 6, 7]]).all()


def test_condition_number_above_the_forward_precision_is_warned_with_a_safe_damping() -> None:
    """A float32 model with near-duplicate features and tiny damping: cond far above 1/eps(float32).

    The warning and the diagnostics name the layer and a damping that brings cond to cond_limit/10;
    with that damping there is no warning. The same curvature in float64 stays below 1/eps(float64).
    """
    torch.manual_seed(82)
    m = MLP(4, 6, 3).eval()
    x, y = data(40, (4,), 3, 82)
    x = x.float()
    x[:, 3] = x[:, 0] * (1 + 1e-6)  # A nearly singular
    settings = InfluenceSettings(method="ekfac", damping=1e-10, fisher="expected")
    factors = fit_factors(m, x, y, ACTIVE, settings)
    assert factors.compute_dtype == "float32"
    with pytest.warns(UserWarning, match=r"1/eps of the float32 forward.*'fc1': .*safe damping >= "):
        selfs = self_influence(m, factors, x, y, ACTIVE, settings)
    row = selfs.diagnostics.set_index("layer").loc["fc1"]
    limit = 1 / np.finfo(np.float32).eps
    assert row["forward_dtype"] == "float32" and row["cond_limit"] == pytest.approx(limit)
    assert row["cond"] > limit and "above 1/eps of the float32 forward" in row["note"]
    safe = InfluenceSettings(
        method="ekfac", damping=float(selfs.diagnostics["safe_damping"].max()), fisher="expected"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = self_influence(m, factors, x, y, ACTIVE, safe)
    assert (fixed.diagnostics["cond"] <= limit / 10 * (1 + 1e-9)).all()
    m64 = MLP(4, 6, 3).double().eval()
    m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    f64 = fit_factors(m64, x.double(), y, ACTIVE, settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d64 = self_influence(m64, f64, x.double(), y, ACTIVE, settings).diagnostics
    assert (d64["cond"] < d64["cond_limit"]).all()


# ---------------------------------------------------------------- pairwise at scale
@pytest.mark.parametrize("method", ["ekfac", "diagonal"])
def test_query_groups_give_the_single_pass_scores(method) -> None:
    """Queries that do not fit query_memory_gb are scored in groups, one training pass per group:
    the same scores as one pass over the training set for all queries."""
    torch.manual_seed(83)
    m = TinyCNN(c=3).double().eval()
    x, y = data(15, (2, 5, 5), 3, 83)
    settings = InfluenceSettings(method=method, query_batch_size=4)
    factors = fit_factors(m, x, y, ACTIVE, settings)
    one = pairwise_influence(m, factors, x, y, x[:9], y[:9], ACTIVE, settings)
    params = sum(lf.out_dim * lf.in_dim for lf in factors.layers.values())
    small = InfluenceSettings(method=method, query_batch_size=4, query_memory_gb=2.5 * params * 8 / 2**30)
    grouped = pairwise_influence(m, factors, x, y, x[:9], y[:9], ACTIVE, small)
    assert one.passes == 1 and grouped.passes == 5  # 2 queries per group
    np.testing.assert_allclose(grouped.scores, one.scores, rtol=1e-12)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_low_rank_query_gradients_are_the_truncated_svd(model) -> None:
    """query_gradient_rank r: each layer's P g_q is replaced by its best rank-r approximation.

    Checked with the identity method (P = I) against a truncated SVD of the explicit per-sample
    gradient matrices; a rank that covers every layer gives the exact scores. The MLP exercises the
    factored product (one position), the CNN the one through the gradient matrix (many positions).
    """
    torch.manual_seed(84)
    m = MLP(6, 8, 3).double().eval() if model == "mlp" else TinyCNN(c=3).double().eval()
    shape = (6,) if model == "mlp" else (2, 5, 5)
    x, y = data(10, shape, 3, 84)
    grads = per_sample_gradients(m, x, y, ACTIVE)
    for rank in (1, 2):
        settings = InfluenceSettings(method="identity", query_gradient_rank=rank)
        got = pairwise_influence(m, None, x, y, x[:4], y[:4], ACTIVE, settings)
        want = np.zeros((4, 10))
        for g in grads.values():
            u, s, vh = torch.linalg.svd(g[:4], full_matrices=False)
            low = (u[:, :, :rank] * s[:, None, :rank]) @ vh[:, :rank, :]
            want += (low.flatten(1) @ g.flatten(1).T).numpy()
        np.testing.assert_allclose(got.scores, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    exact = pairwise_influence(m, None, x, y, x[:4], y[:4], ACTIVE, InfluenceSettings(method="identity"))
    full = pairwise_influence(
        m, None, x, y, x[:4], y[:4], ACTIVE, InfluenceSettings(method="identity", query_gradient_rank=64)
    )
    np.testing.assert_allclose(full.scores, exact.scores, rtol=1e-12)
