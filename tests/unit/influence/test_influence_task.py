"""Tasks other than classification against exact inverse-GGN influence, and the task interface itself.

Ground truth (any task): θ the tracked layers' weights and biases (each layer as its (out, in+1)
gradient matrix, bias last, flattened row-major), z_n(θ) sample n's prediction flattened, J_n its
Jacobian, ℓ_n(z) the task's per-sample loss, H_n = ∂²ℓ_n/∂z² and g_n = J_nᵀ ∂ℓ_n/∂z, all from
autograd on one sample at a time (no hooks, no batching):

    GGN = 1/N Σ_n J_nᵀ H_n J_n,   exact pairwise[q, n] = g_qᵀ (GGN + λI)⁻¹ g_n,

block-diagonal over layers with the damping λ the engine reports per layer. The "expected" Fisher is
used because its expectation is exactly this GGN.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from exact_influence import (
    ConvSoftmax,
    DictDataset,
    LinearSoftmax,
    assert_matches,
    dampings_of,
    data,
    exact_task_scores,
    explicit_task_quantities,
    token_batch,
)
from torch import nn

from epochlens.errors import ConfigError
from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    self_influence,
)
from epochlens.tasks import (
    ClassificationTask,
    LanguageModelTask,
    LossFunctionTask,
    OutputAdapter,
    RegressionTask,
    Uniforms,
    sample_uniforms,
    task_from_config,
)

# ---------------------------------------------------------------- explicit ground truth for any task


# ---------------------------------------------------------------- regression
class RegressionMLP(nn.Module):
    def __init__(self, d: int = 4, h: int = 6, out: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def regression_data(n: int, seed: int, d: int = 4, out: int = 3) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, out, generator=g, dtype=torch.float64).numpy()
    return x, y


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("method", ["ekfac", "kfac"])
def test_regression_last_layer_equals_exact_inverse_ggn(method, reduction) -> None:
    """Squared error: K-FAC/EK-FAC of the last layer of any network equal exact influence.

    Why exact: the output Hessian of ℓ = ‖z − y‖²/D (or the sum) is (2/D)·I (or 2·I) for every
    sample, whatever the weights. The last layer's GGN block is then 1/N Σ_n cI ⊗ a_n a_nᵀ = cI ⊗ A,
    and the expected Fisher's S is cI exactly, so S ⊗ A is the block itself. The network below it
    (Linear + tanh, not tracked) makes a_n non-trivial; weights are random, residuals non-zero.
    """
    torch.manual_seed(20)
    m = RegressionMLP().double().eval()
    x, y = regression_data(25, 20)
    task = RegressionTask(reduction)
    settings = InfluenceSettings(method=method, fisher="expected", damping=1e-8, layers=("fc2",))
    factors = fit_factors(m, x, y, settings=settings, task=task)
    pair = pairwise_influence(m, factors, x, y, x[:6], y[:6], settings=settings, task=task)
    selfs = self_influence(m, factors, x, y, settings=settings, task=task)
    ex = explicit_task_quantities(m, task, x, y, ("fc2",))
    exact_pair, exact_self, _ = exact_task_scores(ex, dampings_of(pair.diagnostics))
    assert_matches(pair.scores, exact_pair[:6])
    assert_matches(selfs.scores, exact_self)
    c = 2.0 / 3 if reduction == "mean" else 2.0
    torch.testing.assert_close(factors.layers["fc2"].gradient_cov, c * torch.eye(3, dtype=torch.float64))
    # The reported loss is the per-sample squared error.
    ref = ((m(x).detach() - torch.as_tensor(y)) ** 2).sum(1)
    np.testing.assert_allclose(selfs.losses, (ref / 3 if reduction == "mean" else ref).numpy(), rtol=1e-12)


def test_regression_diagonal_equals_exact_diagonal_ggn_on_every_layer() -> None:
    """The diagonal method is exact for any network: D = diag(GGN) with the expected Fisher."""
    torch.manual_seed(21)
    m = RegressionMLP().double().eval()
    x, y = regression_data(15, 21)
    task = RegressionTask("mean")
    settings = InfluenceSettings(method="diagonal", fisher="expected", damping=1e-3)
    factors = fit_factors(m, x, y, settings=settings, task=task)
    selfs = self_influence(m, factors, x, y, settings=settings, task=task)
    ex = explicit_task_quantities(m, task, x, y)
    diag = torch.diagonal(ex["ggn"])
    ours = torch.cat([factors.layers[n].diagonal.reshape(-1) for n in ex["slices"]])
    torch.testing.assert_close(ours, diag, rtol=1e-9, atol=1e-14)
    lam = dampings_of(selfs.diagnostics)
    lam_vec = torch.cat([torch.full((sl.stop - sl.start,), lam[n]) for n, sl in ex["slices"].items()])
    np.testing.assert_allclose(selfs.scores, (ex["grads"] ** 2 / (diag + lam_vec)).sum(1).numpy(), rtol=1e-9)


def test_regression_true_fisher_draws_the_gaussian_whose_nll_the_loss_is() -> None:
    """True Fisher: ŷ = z + σε with σ² = D/2 makes E[S] = (2/D)·I, the exact output Hessian."""
    torch.manual_seed(22)
    m = nn.Sequential(nn.Linear(2, 4)).double().eval()
    x, y = regression_data(3000, 22, d=2, out=4)
    task = RegressionTask("mean")
    factors = fit_factors(m, x, y, settings=InfluenceSettings(method="kfac"), task=task)
    s = factors.layers["0"].gradient_cov
    torch.testing.assert_close(s, 0.5 * torch.eye(4, dtype=torch.float64), atol=0.04, rtol=0)


# ---------------------------------------------------------------- token-level language modelling
class TokenLM(nn.Module):
    """Token ids -> embedding (not tracked) -> Linear head with a token dimension, + a logit offset.

    With ``head.weight`` = 0 every position predicts p = softmax(offset). The embedding rows are
    orthogonal with distinct norms (s_k e_k), so every activation covariance is diagonal.
    """

    def __init__(self, vocab: int, zero_head: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, vocab)
        self.head = nn.Linear(vocab, vocab, bias=False)
        self.offset = nn.Parameter(torch.linspace(-1.0, 1.2, vocab) ** 2)
        with torch.no_grad():
            self.embed.weight.copy_(torch.diag(torch.tensor([1.0, 1.37, 1.71, 2.23, 2.9, 3.31][:vocab])))
            if zero_head:
                self.head.weight.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
        return {"logits": self.head(self.embed(input_ids)) + self.offset, "hidden": None}


class CausalMixLM(nn.Module):
    """Embedding -> tracked Linear (token dim) -> causal running mean -> tanh -> tracked head.

    Position t sees only positions <= t, so tokens appended at the end change nothing before them.
    """

    def __init__(self, vocab: int = 6, d: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
        h = self.mix(self.embed(input_ids))
        steps = torch.arange(1, h.shape[1] + 1, dtype=h.dtype, device=h.device)
        h = torch.tanh(h.cumsum(1) / steps[None, :, None])
        return {"logits": self.head(h)}


def test_token_lm_ekfac_equals_exact_inverse_ggn_where_kfac_does_not() -> None:
    """EK-FAC on a Linear head with a token dimension equals exact influence; K-FAC does not.

    Why EK-FAC is exact here: every position predicts the same p (head weight 0, a constant logit
    offset), so every target position has the output Hessian H = diag p − ppᵀ, and the GGN of the
    head is G = H ⊗ A' with A' = 1/N Σ_n 1/T_n Σ_{t target} a_t a_tᵀ (T_n: sample n's target count;
    the per-sample loss is the mean NLL of its targets). K-FAC's S = H exactly (expected Fisher),
    but its A = mean of a_t a_tᵀ over all real positions (prompt and last token included, padding
    excluded) ≠ A', so S ⊗ A ≠ G. The inputs a_t are embedding rows s_k e_k (orthogonal, distinct
    norms), so A and A' are both diagonal: G is diagonal in K-FAC's eigenbasis Q_S ⊗ I, and EK-FAC's
    refitted eigenvalues 1/N Σ_n (Q_Sᵀ G_n Q_A)² are exactly G's. Sequences have different lengths,
    right padding (mask 0) and a prompt token (label -100); the batches are dicts from a Dataset.
    """
    vocab = 5
    m = TokenLM(vocab).double().eval()
    train = token_batch(14, vocab, 30)
    queries = token_batch(4, vocab, 31)
    task = LanguageModelTask()
    ds, qds = DictDataset(train), DictDataset(queries)
    results = {}
    for method in ("ekfac", "kfac"):
        settings = InfluenceSettings(
            method=method, fisher="expected", damping=1e-8, layers=("head",), train_batch_size=5
        )
        factors = fit_factors(m, ds, settings=settings, task=task)
        pair = pairwise_influence(m, factors, ds, None, qds, None, settings=settings, task=task)
        selfs = self_influence(m, factors, ds, settings=settings, task=task)
        results[method] = (factors, pair, selfs)
    factors, pair, selfs = results["ekfac"]
    inputs = {k: train[k] for k in ("input_ids", "attention_mask")}
    q_inputs = {k: queries[k] for k in ("input_ids", "attention_mask")}
    ex = explicit_task_quantities(m, task, inputs, train["labels"], ("head",), q_inputs, queries["labels"])
    exact_pair, exact_self, _ = exact_task_scores(ex, dampings_of(pair.diagnostics))
    # The eigenbasis argument needs distinct non-zero eigenvalues of A (checked, not assumed).
    a_values = factors.layers["head"].activation_values.numpy()
    nonzero = a_values[a_values > 1e-12]
    assert len(np.unique(np.round(nonzero, 10))) == len(nonzero)
    assert_matches(pair.scores, exact_pair)
    assert_matches(selfs.scores, exact_self)
    # K-FAC is not exact here (A ≠ A'): the eigenvalue correction is what makes EK-FAC exact.
    kfac_self = results["kfac"][2].scores
    kfac_exact = exact_task_scores(ex, dampings_of(results["kfac"][2].diagnostics))[1]
    assert np.abs(kfac_self - kfac_exact).max() > 1e-3 * np.abs(kfac_exact).max()
    # Losses: the mean NLL of each sequence's target tokens.
    logp = torch.log_softmax(m.offset.detach(), 0)
    want = [
        float(-logp[train["labels"][i][train["labels"][i] >= 0]].mean()) for i in range(len(train["labels"]))
    ]
    np.testing.assert_allclose(selfs.losses, want, rtol=1e-12)


@pytest.mark.parametrize("method", ["ekfac", "kfac", "diagonal", "identity"])
def test_padding_never_changes_a_score(method) -> None:
    """Appending padding tokens (mask 0, label -100) to every sequence leaves every score identical.

    The network has a tracked Linear before a causal mixing step, so padding positions do reach
    that layer's inputs: only the mask keeps them out of its covariances and gradients.
    """
    torch.manual_seed(32)
    m = CausalMixLM().double().eval()
    task = LanguageModelTask()
    got = []
    for extra in (0, 3):
        train, queries = token_batch(10, 6, 33, extra_pad=extra), token_batch(3, 6, 34, extra_pad=extra)
        ds, qds = DictDataset(train), DictDataset(queries)
        settings = InfluenceSettings(method=method, fisher="expected", damping=1e-3)
        factors = fit_factors(m, ds, settings=settings, task=task) if method != "identity" else None
        pair = pairwise_influence(m, factors, ds, None, qds, None, settings=settings, task=task)
        selfs = self_influence(m, factors, ds, settings=settings, task=task)
        got.append((pair.scores, selfs.scores))
    np.testing.assert_allclose(got[1][0], got[0][0], rtol=1e-10)
    np.testing.assert_allclose(got[1][1], got[0][1], rtol=1e-10)
    assert np.isfinite(got[0][0]).all() and np.isfinite(got[0][1]).all()


def test_token_lm_identity_equals_autograd_gradients_through_a_nonlinear_model() -> None:
    """Gradient dot products on the causal model (two tracked layers with a token dimension)."""
    torch.manual_seed(35)
    m = CausalMixLM().double().eval()
    task = LanguageModelTask()
    train = token_batch(8, 6, 36)
    settings = InfluenceSettings(method="identity", train_batch_size=3, query_batch_size=2)
    selfs = self_influence(m, None, DictDataset(train), settings=settings, task=task)
    inputs = {k: train[k] for k in ("input_ids", "attention_mask")}
    ex = explicit_task_quantities(m, task, inputs, train["labels"])
    np.testing.assert_allclose(selfs.scores, (ex["grads"] ** 2).sum(1).numpy(), rtol=1e-10)


def test_token_lm_without_labels_uses_the_attention_mask_and_a_tensor_of_ids() -> None:
    """Without labels the targets are the input ids of real positions; a bare id tensor has no mask."""
    torch.manual_seed(37)
    m = CausalMixLM().double().eval()
    task = LanguageModelTask()
    train = token_batch(6, 6, 38)
    no_labels = {k: train[k] for k in ("input_ids", "attention_mask")}
    a = self_influence(
        m, None, DictDataset(no_labels), settings=InfluenceSettings(method="identity"), task=task
    )
    with_labels = dict(train)
    with_labels["labels"] = torch.where(train["attention_mask"] > 0, train["input_ids"], -100)
    b = self_influence(
        m, None, DictDataset(with_labels), settings=InfluenceSettings(method="identity"), task=task
    )
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-12)
    # Unpadded sequences as a plain (N, T) integer array: ids, never cast to the float dtype.
    ids = torch.randint(0, 6, (5, 4))
    c = self_influence(m, None, ids, settings=InfluenceSettings(method="identity"), task=task)
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    d = self_influence(m, None, DictDataset(full), settings=InfluenceSettings(method="identity"), task=task)
    np.testing.assert_allclose(c.scores, d.scores, rtol=1e-12)


def test_token_lm_true_fisher_draws_match_the_output_hessian() -> None:
    """True Fisher for tokens: one draw per target position, the gradient weighted by √T_n.

    The per-sample loss is the mean over T_n targets, 1/T_n times the sequence's NLL: its GGN block
    per position is H/T_n (summed over T_n positions: S = H), while an unweighted sampled gradient
    (p − e_ŷ)/T_n has covariance H/T_n² per position. The weight makes E[S] = H, as the expected
    Fisher's S is exactly.
    """
    vocab = 4
    m = TokenLM(vocab).double().eval()
    train = token_batch(1500, vocab, 39, max_len=4)
    factors = fit_factors(
        m,
        DictDataset(train),
        settings=InfluenceSettings(method="kfac", layers=("head",)),
        task=LanguageModelTask(),
    )
    p = torch.softmax(m.offset.detach(), 0)
    h = torch.diag(p) - torch.outer(p, p)
    torch.testing.assert_close(factors.layers["head"].gradient_cov, h, atol=0.02, rtol=0)


# ---------------------------------------------------------------- the task interface
def test_classification_with_all_classes_when_active_classes_is_none() -> None:
    """active_classes=None means every class (it was a TypeError): same as naming them all."""
    m = LinearSoftmax(5, 4).double().eval()
    x, y = data(12, (5,), 4, 40)
    settings = InfluenceSettings(method="ekfac", fisher="expected")
    a = self_influence(m, fit_factors(m, x, y, None, settings), x, y, None, settings)
    b = self_influence(m, fit_factors(m, x, y, np.arange(4), settings), x, y, np.arange(4), settings)
    np.testing.assert_array_equal(a.scores, b.scores)


def test_a_users_loss_function_gives_the_builtin_classification_results() -> None:
    """A per-sample loss function by import path; its generic expected Fisher (Hessian of the loss by
    autograd, eigendecomposed) gives the same factors and scores as the built-in cross-entropy's."""
    m = ConvSoftmax(2, 3, 4).double().eval()
    x, y = data(16, (2, 3, 3), 4, 41)
    settings = InfluenceSettings(method="ekfac", fisher="expected", damping=1e-3)
    user = task_from_config({"name": "torch.nn.functional:cross_entropy", "kwargs": {"reduction": "none"}})
    assert isinstance(user, LossFunctionTask)
    ref = fit_factors(m, x, y, np.arange(4), settings)
    got = fit_factors(m, x, y, settings=settings, task=user)
    torch.testing.assert_close(
        got.layers["conv"].gradient_cov, ref.layers["conv"].gradient_cov, rtol=1e-10, atol=1e-14
    )
    torch.testing.assert_close(
        got.layers["conv"].corrected, ref.layers["conv"].corrected, rtol=1e-8, atol=1e-14
    )
    a = pairwise_influence(m, got, x, y, x[:3], y[:3], settings=settings, task=user)
    b = pairwise_influence(m, ref, x, y, x[:3], y[:3], np.arange(4), settings)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-8)
    with pytest.raises(ConfigError, match="no predictive distribution to draw targets from"):
        fit_factors(m, x, y, settings=InfluenceSettings(fisher="true"), task=user)


class MarginTask(ClassificationTask):
    """A user's Task subclass: queries measure the margin of their label over the best other class."""

    def measurement(self, prediction, targets, inputs):
        pos = self.positions(torch.as_tensor(targets), prediction.shape[1])
        own = prediction.gather(1, pos[:, None])[:, 0]
        others = prediction.scatter(1, pos[:, None], -math.inf).max(1).values
        return others - own  # lower is better, like a loss


def test_a_users_task_class_by_import_path_with_its_own_measurement() -> None:
    """The query side uses the task's measurement: scores are g_measurementᵀ P g_loss."""
    task = task_from_config("test_influence_task:MarginTask")
    assert isinstance(task, MarginTask) and task.active is None
    m = LinearSoftmax(5, 3).double().eval()
    x, y = data(10, (5,), 3, 42)
    pair = pairwise_influence(
        m, None, x, y, x[:2], y[:2], settings=InfluenceSettings(method="identity"), task=task
    )
    ex = explicit_task_quantities(m, task, x, y, (), x[:2], y[:2])
    np.testing.assert_allclose(pair.scores, (ex["query_grads"] @ ex["grads"].T).numpy(), rtol=1e-10)


def test_task_config_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="not one of .*classification.*import path"):
        task_from_config("segmentation")
    with pytest.raises(ConfigError, match="cannot import 'no_such_package.losses'"):
        task_from_config("no_such_package.losses:mse")
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        task_from_config("torch.nn.functional:nope")
    with pytest.raises(ConfigError, match="does not derive from epochlens.tasks.Task"):
        task_from_config("torch.nn:Linear")
    with pytest.raises(ConfigError, match="reduction='median' must be 'mean' or 'sum'"):
        task_from_config({"name": "regression", "reduction": "median"})
    with pytest.raises(ConfigError, match="unexpected keyword argument 'bogus'"):
        task_from_config({"name": "language_model", "bogus": 1})
    bad = LossFunctionTask(lambda z, y: torch.nn.functional.cross_entropy(z, torch.as_tensor(y)))
    m = LinearSoftmax(5, 3).double().eval()
    x, y = data(6, (5,), 3, 43)
    with pytest.raises(ConfigError, match=r"returned a loss of shape \(\) for a batch of 6 samples"):
        self_influence(m, None, x, y, settings=InfluenceSettings(method="identity"), task=bad)


def test_output_adapter_reads_tensors_tuples_dicts_and_model_outputs() -> None:
    z = torch.ones(2, 3)

    class Out:  # attribute access, as a dataclass output
        logits = z

    assert OutputAdapter()(z) is z
    assert OutputAdapter()((z, None)) is z
    assert OutputAdapter(1)((None, z)) is z
    assert OutputAdapter()({"loss": None, "logits": z}) is z
    assert OutputAdapter("scores")({"scores": z}) is z
    assert OutputAdapter()(Out()) is z
    with pytest.raises(ConfigError, match=r"fields \['hidden'\], none named 'logits'"):
        OutputAdapter()({"hidden": z})
    transformers = pytest.importorskip("transformers")
    out = transformers.modeling_outputs.CausalLMOutput(logits=z)
    assert OutputAdapter()(out) is z


def test_per_sample_draws_depend_only_on_seed_and_index() -> None:
    """Uniforms keyed by (seed, index, draw): batch-invariant; draw 0 is the classification stream."""
    idx = np.array([5, 9, 2, 7])
    full = sample_uniforms(3, idx, 4)
    np.testing.assert_array_equal(sample_uniforms(3, idx[2:], 4), full[2:])
    np.testing.assert_array_equal(sample_uniforms(3, idx), full[:, 0])
    u = Uniforms(3, idx)
    np.testing.assert_array_equal(torch.cat([u(1), u(3)], 1).numpy(), full)
    normals = Uniforms(0, np.arange(20000)).normal(1)
    assert abs(float(normals.mean())) < 0.03 and abs(float(normals.std()) - 1) < 0.03
