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

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from torch import nn
from torch.func import functional_call, jacrev, vmap

from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    per_sample_gradients,
    select_layers,
    self_influence,
    tracin_pairwise,
    tracin_self,
)
from epochlens.influence.layers import rotated_gradient
from epochlens.models.networks import positions_in


# ---------------------------------------------------------------- explicit ground truth helpers
def explicit_quantities(
    model: nn.Module, x: torch.Tensor, y: np.ndarray, active: np.ndarray, layer_names: list[str] | None = None
) -> dict:
    """GGN (P, P), per-sample gradients (N, P), Hessian of the mean loss (P, P), layer slices.

    Parameters are the tracked layers' (out, in+1) matrices flattened row-major, in module order.
    """
    model = model.eval()
    layers = select_layers(model, tuple(layer_names or ()))
    params = {n: t.detach() for n, t in model.named_parameters()}
    buffers = {n: t.detach() for n, t in model.named_buffers()}
    slices, start, parts = {}, 0, []
    for name, info in layers.items():
        w = params[f"{name}.weight"].reshape(info.out_dim, -1)
        m = torch.cat([w, params[f"{name}.bias"][:, None]], 1) if info.has_bias else w
        parts.append(m.reshape(-1))
        slices[name] = slice(start, start + m.numel())
        start += m.numel()
    theta = torch.cat(parts)
    active_t = torch.as_tensor(active)
    targets = torch.as_tensor(positions_in(y, active))

    def logits(th: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
        p = dict(params)
        for name, info in layers.items():
            m = th[slices[name]].reshape(info.out_dim, info.in_dim)
            p[f"{name}.weight"] = m[:, : info.in_features].reshape(params[f"{name}.weight"].shape)
            if info.has_bias:
                p[f"{name}.bias"] = m[:, -1]
        out = functional_call(model, {**p, **buffers}, (xi[None],))
        return out.index_select(1, active_t)[0]  # the active classes, in order

    jac = vmap(jacrev(logits), in_dims=(None, 0))(theta, x)  # (N, A, P)
    z = vmap(logits, in_dims=(None, 0))(theta, x)
    prob = torch.softmax(z, 1)
    h_out = torch.diag_embed(prob) - prob[:, :, None] * prob[:, None, :]
    ggn = torch.einsum("nap,nab,nbq->pq", jac, h_out, jac) / len(x)
    resid = prob - torch.nn.functional.one_hot(targets, len(active)).to(prob.dtype)
    grads = torch.einsum("nap,na->np", jac, resid)

    def mean_loss(th: torch.Tensor) -> torch.Tensor:
        zz = vmap(logits, in_dims=(None, 0))(th, x)
        return torch.nn.functional.cross_entropy(zz, targets)

    hessian = torch.func.hessian(mean_loss)(theta)
    return {"ggn": ggn, "grads": grads, "hessian": hessian, "slices": slices, "prob": prob}


def exact_scores(ex: dict, dampings: dict[str, float], block_diagonal: bool = True):
    """Exact pairwise (N, N) and self (N,) influence with per-layer damping."""
    ggn = ex["ggn"].clone()
    if block_diagonal:
        mask = torch.zeros_like(ggn, dtype=torch.bool)
        for sl in ex["slices"].values():
            mask[sl, sl] = True
        ggn = torch.where(mask, ggn, torch.zeros_like(ggn))
    lam = torch.zeros(ggn.shape[0], dtype=ggn.dtype)
    for name, sl in ex["slices"].items():
        lam[sl] = dampings[name]
    solved = torch.linalg.solve(ggn + torch.diag(lam), ex["grads"].T)  # (P, N)
    pair = ex["grads"] @ solved
    return pair.numpy(), torch.diagonal(pair).numpy().copy()


def dampings_of(diagnostics) -> dict[str, float]:
    return dict(zip(diagnostics["layer"], diagnostics["damping"], strict=True))


# ---------------------------------------------------------------- models
class LinearSoftmax(nn.Module):
    """z = W x + b on flattened inputs."""

    def __init__(self, d: int, c: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class ConvSoftmax(nn.Module):
    """A convolution whose kernel covers the whole image (one output position) -> logits."""

    def __init__(self, c_in: int, side: int, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c, side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(1)


class MLP(nn.Module):
    def __init__(self, d: int, h: int, c: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class TinyCNN(nn.Module):
    """Padded, strided and dilated convolutions (with and without bias), BatchNorm, pooling, Linear."""

    def __init__(self, c: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(4, 4, (3, 2), padding=(2, 1), dilation=(2, 1))
        self.fc = nn.Linear(4, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv3(torch.relu(self.conv2(x))))
        return self.fc(x.mean((2, 3)))


def constant_output_linear(d: int, c: int, seed: int) -> LinearSoftmax:
    """W = 0, b random: every input gets the same probabilities p = softmax(b)."""
    g = torch.Generator().manual_seed(seed)
    m = LinearSoftmax(d, c).double()
    with torch.no_grad():
        m.fc.weight.zero_()
        m.fc.bias.copy_(torch.randn(c, generator=g, dtype=torch.float64))
    return m.eval()


def constant_output_mlp(d: int, seed: int) -> MLP:
    """A 2-layer MLP whose output probabilities are the same for every input (see the test doc).

    Hidden units 0-3 depend on x (ReLU patterns vary between samples; unit 3 is always dead),
    units 4-7 have zero input weights and constant pre-activations (unit 7 dead). fc2 reads only
    units 4-7, so the logits are constant. With 4 outputs.
    """
    g = torch.Generator().manual_seed(seed)
    m = MLP(d, 8, 4).double()
    with torch.no_grad():
        m.fc1.weight.zero_()
        m.fc1.weight[:4] = torch.randn(4, d, generator=g, dtype=torch.float64)
        m.fc1.bias.copy_(torch.tensor([0.1, -0.2, 0.3, -50.0, 0.5, 1.0, 1.5, -1.0], dtype=torch.float64))
        m.fc2.weight.zero_()
        m.fc2.weight[:, 4:] = torch.randn(4, 4, generator=g, dtype=torch.float64)
        m.fc2.bias.copy_(torch.randn(4, generator=g, dtype=torch.float64))
    return m.eval()


def data(n: int, shape: tuple[int, ...], classes: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    y = np.random.default_rng(seed).integers(0, classes, n)
    return x, y


def assert_matches(ours: np.ndarray, exact: np.ndarray, rtol: float = 1e-6) -> None:
    scale = np.abs(exact).max()
    np.testing.assert_allclose(ours, exact, rtol=rtol, atol=rtol * scale)
    # Rank agreement; rounded so that scores tied in exact arithmetic stay tied.
    rounded = [np.round(a.ravel() / scale, 9) for a in (ours, exact)]
    assert spearmanr(*rounded).statistic >= 0.99


# ---------------------------------------------------------------- tests
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


@pytest.mark.parametrize("method", ["ekfac", "kfac"])
@pytest.mark.parametrize("arch", ["linear", "conv"])
def test_kronecker_methods_equal_exact_influence_where_the_factorisation_is_exact(method, arch) -> None:
    """EK-FAC and K-FAC with tiny damping reproduce exact inverse-GGN influence.

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


def test_ekfac_improves_on_kfac_where_the_factorisation_is_not_exact() -> None:
    """A generic linear softmax model (W ≠ 0): not exact, but EK-FAC stays close to the truth."""
    torch.manual_seed(3)
    m = LinearSoftmax(6, 4).double().eval()
    x, y = data(40, (6,), 4, 3)
    active = np.arange(4)
    ex = explicit_quantities(m, x, y, active)
    rho, err = {}, {}
    for method in ("ekfac", "kfac"):
        settings = InfluenceSettings(method=method, fisher="expected", damping=1e-3)
        factors = fit_factors(m, x, y, active, settings)
        selfs = self_influence(m, factors, x, y, active, settings)
        _, exact_self = exact_scores(ex, dampings_of(selfs.diagnostics))
        rho[method] = spearmanr(selfs.scores, exact_self).statistic
        err[method] = np.abs(selfs.scores - exact_self).mean() / np.abs(exact_self).mean()
    assert rho["ekfac"] >= 0.9, rho
    assert err["ekfac"] < err["kfac"], err


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
