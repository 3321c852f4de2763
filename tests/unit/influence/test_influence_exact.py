"""Influence scores against exact answers computed from explicit matrices on tiny float64 models.

Ground truth: with θ the tracked layers' weights and biases (each layer as its (out, in+1) gradient
matrix, bias last, flattened row-major), J_n = ∂z_n/∂θ the Jacobian of sample n's active-class
logits, p_n = softmax(z_n) and H_n = diag(p_n) − p_n p_nᵀ the cross-entropy's Hessian in z,

    GGN = 1/N Σ_n J_nᵀ H_n J_n,   g_n = J_nᵀ (p_n − e_{y_n}),
    exact pairwise[q, n] = g_qᵀ (GGN + λI)⁻¹ g_n,   exact self[n] = g_nᵀ (GGN + λI)⁻¹ g_n,

with the damping λ the engine reports per layer (block-diagonal GGN when layers differ in λ).
The "expected" Fisher is used because its expectation over labels is exactly this GGN.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from exact_influence import (
    MLP,
    ConvSoftmax,
    LinearSoftmax,
    TinyCNN,
    assert_matches,
    constant_output_linear,
    constant_output_mlp,
    dampings_of,
    data,
    exact_scores,
    explicit_quantities,
)
from quality import SEED, above, at_least, below
from scipy.stats import spearmanr
from torch import nn

from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    gradient_math,
    pairwise_influence,
    per_sample_gradients,
    self_influence,
    tracin_pairwise,
    tracin_self,
)
from epochlens.influence import held_queries as held_queries_module
from epochlens.influence import layers as layer_math
from epochlens.influence.gradients import forward_backprop, prepared_model
from epochlens.influence.layer_selection import select_layers
from epochlens.influence.layers import (
    ActivationCapture,
    gram_,
    held_in_eigenbasis,
    layer_inputs,
    layer_output_grads,
    rotated_gradient,
    symmetrize_,
)
from epochlens.tasks import ClassificationTask


def test_explicit_ggn_is_the_hessian_for_a_linear_model() -> None:
    """The ground truth is the real Hessian where it should be: a model linear in its parameters."""
    m = LinearSoftmax(4, 3).double()
    x, y = data(10, (4,), 3, 0)
    ex = explicit_quantities(m, x, y, np.arange(3))
    torch.testing.assert_close(ex["ggn"], ex["hessian"], rtol=1e-10, atol=1e-12)
    # The per-sample gradients of the ground truth are those of autograd on the loss.
    loss = torch.nn.functional.cross_entropy(m(x[:1]), torch.as_tensor(y[:1]))
    gw, gb = torch.autograd.grad(loss, [m.fc.weight, m.fc.bias])
    torch.testing.assert_close(ex["grads"][0], torch.cat([gw, gb[:, None]], 1).reshape(-1))


@pytest.mark.parametrize("in_basis", [False, True])
@pytest.mark.parametrize("method", ["ekfac", "kfac"])
@pytest.mark.parametrize("arch", ["linear", "conv"])
def test_kronecker_methods_equal_exact_influence_where_the_factorisation_is_exact(
    monkeypatch, method, arch, in_basis
) -> None:
    """EK-FAC and K-FAC with tiny damping reproduce exact inverse-GGN influence, with the queries
    held as P g_q or in the eigenbasis as D Rᵀ g_q (pairwise's two ways, forced here).

    Why the Kronecker factorisation is exact here: the layer is the only one and its weight is 0,
    so every sample gets the same probabilities p = softmax(b) and the same output Hessian
    H = diag(p) − p pᵀ. The GGN is then 1/N Σ_n H ⊗ a_n a_nᵀ = H ⊗ A exactly, and the expected
    Fisher's S equals H, so K-FAC's S ⊗ A is the GGN itself (and EK-FAC's refitted eigenvalues
    equal K-FAC's). Gradients are not trivial: g_n = (p − e_{y_n}) ⊗ [x_n, 1] differs per sample.
    The conv variant has one output position (kernel = image), which exercises the unfold path and
    the channel-major patch order. Three of four classes are active (restricted logits).
    """
    active = np.array([0, 2, 3])
    if arch == "linear":
        m = constant_output_linear(5, 4, seed=1)
        x, y = data(24, (5,), 4, 1)
    else:
        m = ConvSoftmax(2, 3, 4).double()
        with torch.no_grad():
            m.conv.weight.zero_()
            m.conv.bias.copy_(torch.tensor([0.3, -1.0, 0.8, 0.1], dtype=torch.float64))
        x, y = data(24, (2, 3, 3), 4, 1)
    y = active[y % 3]
    monkeypatch.setattr(held_queries_module, "held_in_eigenbasis", lambda *shapes: in_basis)
    settings = InfluenceSettings(method=method, fisher="expected", damping=1e-8)
    factors = fit_factors(m, x, y, active, settings)
    pair = pairwise_influence(m, factors, x, y, x[:7], y[:7], active, settings)
    selfs = self_influence(m, factors, x, y, active, settings)
    ex = explicit_quantities(m, x, y, active)
    exact_pair, exact_self = exact_scores(ex, dampings_of(pair.diagnostics))
    assert_matches(pair.scores, exact_pair[:7])
    assert_matches(selfs.scores, exact_self)
    # Tiny damping: λ is 1e-8 of the mean eigenvalue, so the scores are those of the GGN itself.
    assert (pair.diagnostics["damping"] < 1e-7 * pair.diagnostics["max_eig"]).all()


@pytest.mark.parametrize("method", ["ekfac", "kfac"])
def test_two_layer_mlp_with_dead_relus_matches_exact_block_diagonal_ggn(method) -> None:
    """Per-layer Kronecker blocks are exact for this MLP; K-FAC is block-diagonal over layers.

    Why exact per layer: the logits are the same for every input (fc2 reads only hidden units
    whose input weights are zero), so H is constant. fc2's block is H ⊗ mean(a₂a₂ᵀ). fc1's output
    gradient is D W₂ᵀ(p − e_y) with D the ReLU mask of units 4-7, constant because their
    pre-activations are; so fc1's block is (D W₂ᵀ H W₂ D) ⊗ mean(a₁a₁ᵀ). Units 3 and 7 are dead,
    units 0-2 switch on and off between samples. The cross-layer blocks of the GGN are not zero,
    which K-FAC ignores by design, so the reference is the exact block-diagonal GGN.
    """
    m = constant_output_mlp(3, seed=2)
    x, y = data(30, (3,), 4, 2)
    active = np.arange(4)
    settings = InfluenceSettings(method=method, fisher="expected", damping=1e-8)
    factors = fit_factors(m, x, y, active, settings)
    pair = pairwise_influence(m, factors, x, y, x[:5], y[:5], active, settings)
    selfs = self_influence(m, factors, x, y, active, settings)
    ex = explicit_quantities(m, x, y, active)
    exact_pair, exact_self = exact_scores(ex, dampings_of(pair.diagnostics))
    assert_matches(pair.scores, exact_pair[:5])
    assert_matches(selfs.scores, exact_self)
    # The dead units leave exact zeros in the factors; nothing became NaN.
    a2 = factors.layers["fc2"].activation_cov
    assert float(a2[3, 3]) == 0.0 and float(a2[7, 7]) == 0.0
    assert np.isfinite(pair.diagnostics["cond"]).all()


#: Draws of the generic model below: EK-FAC's gain over K-FAC and over the gradient dot product is
#: a claim about such models on average, not about each draw (docs/development.md).
DRAWS = 5


@pytest.mark.quality
def test_ekfac_improves_on_kfac_where_the_factorisation_is_not_exact() -> None:
    """A generic linear softmax model (W ≠ 0): not exact, but EK-FAC stays close to the truth, and
    closer than K-FAC and the gradient dot product, over several draws of the model and data."""
    rho, err = {m: [] for m in ("ekfac", "kfac", "identity")}, {m: [] for m in ("ekfac", "kfac")}
    for draw in range(DRAWS):
        torch.manual_seed(3 + DRAWS * SEED + draw)
        m = LinearSoftmax(6, 4).double().eval()
        x, y = data(40, (6,), 4, 3 + DRAWS * SEED + draw)
        active = np.arange(4)
        ex = explicit_quantities(m, x, y, active)
        for method in rho:
            settings = InfluenceSettings(method=method, fisher="expected", damping=1e-3)
            factors = fit_factors(m, x, y, active, settings)
            selfs = self_influence(m, factors, x, y, active, settings)
            if method != "identity":  # the gradient dot product: against EK-FAC's exact reference
                _, exact_self = exact_scores(ex, dampings_of(selfs.diagnostics))
                err[method].append(np.abs(selfs.scores - exact_self).mean() / np.abs(exact_self).mean())
            rho[method].append(spearmanr(selfs.scores, exact_self).statistic)
    rho, err = {k: np.array(v) for k, v in rho.items()}, {k: np.array(v) for k, v in err.items()}
    at_least(
        "EK-FAC self-influence ρ against the exact inverse GGN, worst draw", rho["ekfac"].min(), 0.9, rho
    )
    gain = (rho["ekfac"] - rho["identity"]).mean()
    above("EK-FAC ρ - gradient dot product (identity) ρ, mean over draws", gain, 0, rho)
    below(
        "EK-FAC error - K-FAC error (relative, mean over draws)", (err["ekfac"] - err["kfac"]).mean(), 0, err
    )


def test_diagonal_method_equals_exact_diagonal_ggn_for_any_model() -> None:
    """With the expected Fisher the diagonal method's D is diag(GGN) exactly, for any network."""
    torch.manual_seed(4)
    m = TinyCNN().double().eval()
    m.bn1.running_mean.uniform_(-0.2, 0.2)
    m.bn1.running_var.uniform_(0.5, 2.0)
    x, y = data(12, (2, 5, 5), 5, 4)
    active = np.arange(5)
    settings = InfluenceSettings(method="diagonal", fisher="expected", damping=1e-3)
    factors = fit_factors(m, x, y, active, settings)
    selfs = self_influence(m, factors, x, y, active, settings)
    ex = explicit_quantities(m, x, y, active)
    diag = torch.diagonal(ex["ggn"])
    ours = torch.cat([factors.layers[n].diagonal.reshape(-1) for n in ex["slices"]])
    torch.testing.assert_close(ours, diag, rtol=1e-9, atol=1e-14)
    damping = dampings_of(selfs.diagnostics)
    lam = torch.cat([torch.full((sl.stop - sl.start,), damping[n]) for n, sl in ex["slices"].items()])
    exact_self = (ex["grads"] ** 2 / (diag + lam)).sum(1).numpy()
    np.testing.assert_allclose(selfs.scores, exact_self, rtol=1e-7)


def test_identity_equals_explicit_per_sample_gradient_dot_products() -> None:
    """Gradient dot products from hooks (KFC unfold, bias column) equal autograd's per-sample ones."""
    torch.manual_seed(5)
    m = TinyCNN().double().eval()
    x, y = data(10, (2, 5, 5), 5, 5)
    active = np.array([0, 1, 3, 4])
    y = active[y % 4]
    ex = explicit_quantities(m, x, y, active)
    settings = InfluenceSettings(method="identity", train_batch_size=3, query_batch_size=2)
    pair = pairwise_influence(m, None, x, y, x[:4], y[:4], active, settings)
    selfs = self_influence(m, None, x, y, active, settings)
    exact = (ex["grads"] @ ex["grads"].T).numpy()
    scale = np.abs(exact).max()
    assert np.abs(pair.scores - exact[:4]).max() <= 1e-6 * scale
    assert np.abs(selfs.scores - np.diag(exact)).max() <= 1e-6 * scale
    # The per-sample gradient matrices themselves, layer by layer.
    grads = per_sample_gradients(m, x, y, active)
    for name, sl in ex["slices"].items():
        torch.testing.assert_close(grads[name].reshape(len(x), -1), ex["grads"][:, sl], rtol=1e-9, atol=1e-12)


def test_tracin_sums_weighted_dot_products_over_checkpoints() -> None:
    """TracIn over two checkpoints with learning-rate weights and per-checkpoint active classes."""
    torch.manual_seed(6)
    models = [MLP(3, 5, 4).double().eval() for _ in range(2)]
    x, y = data(9, (3,), 2, 6)
    actives = [np.array([0, 1]), np.array([0, 1, 2])]
    weights = [0.1, 0.05]
    pair = tracin_pairwise(models, weights, x, y, x[:3], y[:3], actives)
    selfs = tracin_self(models, weights, x, y, actives)
    exact = sum(
        w * (lambda g: g @ g.T)(explicit_quantities(mm, x, y, a)["grads"]).numpy()
        for mm, a, w in zip(models, actives, weights, strict=True)
    )
    np.testing.assert_allclose(pair.scores, exact[:3], rtol=1e-10)
    np.testing.assert_allclose(selfs.scores, np.diag(exact), rtol=1e-10)


@pytest.mark.parametrize("positions", [1, 3, 40])
def test_rotated_gradient_equals_rotating_the_gradient_matrix(positions) -> None:
    """Both evaluation orders of Q_Sᵀ (Σ_t ds_t a_tᵀ) Q_A (few positions: factored; many: direct)."""
    g = torch.Generator().manual_seed(positions)
    a = torch.randn(2, positions, 6, generator=g, dtype=torch.float64)
    ds = torch.randn(2, positions, 4, generator=g, dtype=torch.float64)
    qs = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))[0]
    qa = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))[0]
    direct = qs.T @ torch.einsum("bto,bti->boi", ds, a) @ qa
    torch.testing.assert_close(rotated_gradient(a, ds, qs, qa), direct, rtol=1e-12, atol=1e-12)


def test_pairwise_holds_in_the_eigenbasis_where_rotating_the_training_gradients_costs_less() -> None:
    """ResNet-18's shapes: layer4 (T = 16, 512 x 4,609) in the eigenbasis at 60 training samples and
    20 queries, layer1 (T = 1,024, 64 x 577) not (rotating each training gradient costs as much as
    each query); at 50,000 training samples and 100 queries neither."""
    assert held_in_eigenbasis(16, 512, 4609, 60, 20)
    assert not held_in_eigenbasis(1024, 64, 577, 60, 20)
    assert held_in_eigenbasis(1024, 64, 577, 19, 20)
    assert not held_in_eigenbasis(16, 512, 4609, 50_000, 100)


@pytest.mark.parametrize("dim", [1, 3, 4, 5, 11])
def test_gram_by_upper_blocks_then_mirrored_is_the_full_product(monkeypatch, dim) -> None:
    """Σ_batches aᵀa from the block rows of the upper triangle (blocks of 4: one, several, ragged)."""
    monkeypatch.setattr(gradient_math, "GRAM_BLOCK", 4)
    g = torch.Generator().manual_seed(dim)
    batches = [torch.randn(7, dim, generator=g, dtype=torch.float64) for _ in range(3)]
    out = torch.zeros(dim, dim, dtype=torch.float64)
    for a in batches:
        gram_(out, a)
    for start in range(4, dim, 4):  # nothing left of the diagonal blocks until mirrored
        assert torch.count_nonzero(out[start:, :start]) == 0
    full = sum(a.T @ a for a in batches)
    torch.testing.assert_close(symmetrize_(out), full, rtol=1e-13, atol=1e-13)
    assert torch.equal(out, out.T)


def test_layer_inputs_and_output_grads_are_unfold_and_the_transpose_in_the_stored_dtype() -> None:
    """One copy writes patches, cast and bias column: equal to F.unfold + ones, in float64 from a
    float32 input (stride, padding, dilation), and a (B, T, d) Linear input with a padding mask."""
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=2)
    (info,) = select_layers(nn.Sequential(conv)).values()
    x = torch.randn(2, 3, 9, 8)
    a = layer_inputs(info, x, dtype=torch.float64)
    patches = F.unfold(x.double(), 3, dilation=2, padding=1, stride=2).transpose(1, 2)
    assert a.dtype == torch.float64 and a.is_contiguous()
    torch.testing.assert_close(a, torch.cat([patches, torch.ones(*patches.shape[:2], 1).double()], 2))
    ds = torch.randn(2, 4, 3, 3)
    scale = torch.tensor([2.0, 0.25], dtype=torch.float64)
    got = layer_output_grads(info, ds, dtype=torch.float64, scale=scale)
    expected = ds.double().flatten(2).transpose(1, 2) / scale[:, None, None]
    assert got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)

    linear = nn.Linear(5, 2)
    (info,) = select_layers(nn.Sequential(linear)).values()
    x = torch.randn(2, 4, 5)
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    a = layer_inputs(info, x, mask, torch.float64)
    expected = torch.cat([x.double(), torch.ones(2, 4, 1).double()], 2) * mask[:, :, None]
    torch.testing.assert_close(a, expected, rtol=0, atol=0)
    x_before = x.clone()
    linear_nobias = nn.Linear(5, 2, bias=False)
    (info,) = select_layers(nn.Sequential(linear_nobias)).values()
    layer_inputs(info, x, mask)  # a view of x with the mask applied: x itself untouched
    assert torch.equal(x, x_before)


def _tiny_backprop(x, y) -> tuple:
    m = TinyCNN().float().eval()
    task = ClassificationTask(np.arange(5))
    layers = select_layers(m)
    with (
        prepared_model(m, layers, torch.device("cpu"), torch.float32) as net,
        ActivationCapture(layers) as cap,
    ):
        bp = forward_backprop(
            net, cap, task, x.float(), torch.as_tensor(y, dtype=torch.float64), "loss", 0, np.arange(len(x))
        )
    return layers, bp


def test_a_batch_keeps_the_compute_dtype_and_gives_any_layer_unscaled_in_float64_by_chunks(
    monkeypatch,
) -> None:
    """forward_backprop keeps the network's float32 tensors; factored writes a layer's patches and
    its output gradients divided by the scales in float64; chunks of any size give the same rows."""
    x, y = data(6, (2, 6, 6), 5, seed=3)
    layers, bp = _tiny_backprop(x, y)
    rows = torch.tensor([True, False, True, True, True, True])
    for n, info in layers.items():
        (x_n,) = bp.calls[n]
        (g_n,) = bp.output_grads[0][n]
        assert x_n.dtype == g_n.dtype == torch.float32
        (a, d), *_ = bp.factored(n, torch.float64, rows)
        torch.testing.assert_close(a, layer_inputs(info, x_n[rows].double()), rtol=0, atol=0)
        expected = layer_output_grads(info, g_n[rows].double()) / bp.scales[0][rows][:, None, None]
        torch.testing.assert_close(d, expected, rtol=0, atol=0)
        for budget in (1, a[0].numel() * 8 * 2 + d[0].numel() * 8 * 2, 2**30):
            monkeypatch.setattr(gradient_math, "CHUNK_BYTES", budget)
            parts = list(bp.chunks(n, torch.float64, rows))
            assert len(parts) == {1: 5, 2**30: 1}.get(budget, 3)
            torch.testing.assert_close(torch.cat([p[0] for p in parts]), a, rtol=0, atol=0)
            torch.testing.assert_close(torch.cat([p[1][0] for p in parts]), d, rtol=0, atol=0)


def test_live_positions_are_the_nonzero_inputs_without_unfolding() -> None:
    """live_positions from a layer's input equals (layer_inputs != 0).any: convolutions with and
    without bias (padding, stride, dilation), a Linear with a token mask, with and without bias."""
    x = torch.randn(3, 2, 7, 6)
    x[0] = 0
    x[1, :, :3] = 0
    for conv in (
        nn.Conv2d(2, 3, 3, padding=1, bias=False),
        nn.Conv2d(2, 3, (3, 2), stride=2, padding=(2, 1), dilation=(2, 1), bias=False),
        nn.Conv2d(2, 3, 3, padding=1),
    ):
        (info,) = select_layers(nn.Sequential(conv)).values()
        expected = (layer_inputs(info, x) != 0).any(2)
        assert torch.equal(layer_math.live_positions(info, x), expected)
    tokens = torch.randn(2, 4, 5)
    tokens[0, 1] = 0
    mask = torch.tensor([[True, True, True, False], [True, False, True, False]])
    for bias in (True, False):
        (info,) = select_layers(nn.Sequential(nn.Linear(5, 2, bias=bias))).values()
        expected = (layer_inputs(info, tokens, mask) != 0).any(2)
        assert torch.equal(layer_math.live_positions(info, tokens, mask), expected)


def test_an_accelerator_works_through_a_large_layer_in_chunks_of_many_samples() -> None:
    """ResNet-18's layer4 conv (512 x 4,609, 18.9 MB a float64 gradient matrix): one sample a chunk on a
    CPU (16 MiB), and chunks of 14 on an accelerator (256 MiB), where one sample a chunk measured 2.5-3.4x
    slower on an H200; a meta tensor stands for a CUDA one (same device type check, no GPU needed)."""
    per_sample = 512 * 4609 * 8
    cpu = layer_math.sample_chunks(32, per_sample, device=torch.device("cpu"))
    gpu = layer_math.sample_chunks(32, per_sample, device=torch.device("cuda"))
    assert [p.stop - p.start for p in cpu] == [1] * 32
    assert [p.stop - p.start for p in gpu] == [14, 14, 4]
    for device, parts in (("meta", [slice(0, 3)]), ("cpu", [slice(0, 1), slice(1, 2), slice(2, 3)])):
        a = torch.zeros(3, 1, 4609, dtype=torch.float64, device=device)
        ds = torch.zeros(3, 1, 512, dtype=torch.float64, device=device)
        assert [part for part, _ in layer_math.gradient_chunks(a, ds)] == parts


@pytest.mark.parametrize("method", ["ekfac", "diagonal"])
def test_factors_and_scores_do_not_depend_on_the_chunk_size(monkeypatch, method) -> None:
    """One sample at a time or the whole batch at once: the same factors and scores up to rounding,
    with one query's gradient held at a time (several passes over the training set)."""
    m = TinyCNN().double().eval()
    x, y = data(10, (2, 6, 6), 5, seed=4)
    xq, yq = data(3, (2, 6, 6), 5, seed=5)
    out = {}
    for budget in (1, 2**30):
        monkeypatch.setattr(gradient_math, "CHUNK_BYTES", budget)
        s = InfluenceSettings(method=method, factor_batch_size=4, train_batch_size=4, query_batch_size=2)
        f = fit_factors(m, x, y, np.arange(5), s)
        pair = pairwise_influence(m, f, x, y, xq, yq, np.arange(5), replace(s, query_memory_gb=1e-9))
        out[budget] = (f, pair.scores, self_influence(m, f, x, y, np.arange(5), s).scores)
        assert pair.passes == 3
    (f1, p1, s1), (f2, p2, s2) = out[1], out[2**30]
    for n, lf in f1.layers.items():
        for got, want in (
            (lf.activation_cov, f2.layers[n].activation_cov),
            (lf.gradient_cov, f2.layers[n].gradient_cov),
            (lf.corrected, f2.layers[n].corrected),
            (lf.diagonal, f2.layers[n].diagonal),
        ):
            if want is not None:
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(p1, p2, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(s1, s2, rtol=1e-9, atol=1e-12)
