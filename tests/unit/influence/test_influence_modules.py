"""Modules the engine must track as they are written in real models.

In-place activations after a tracked layer, a module called twice (recurrence), modules sharing a
weight (tying), GPT-2's transposed ``Conv1D``, layers that cannot be tracked, and the model itself
left exactly as it was (no copy, no hooks, flags and tensors restored).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from exact_influence import MLP, DictDataset, data, explicit_quantities, explicit_task_quantities, token_batch
from torch import nn

from epochlens.influence import (
    InfluenceSettings,
    LayerSelectionError,
    fit_factors,
    gradient_to_parameters,
    pairwise_influence,
    per_sample_gradients,
    select_layers,
    self_influence,
)
from epochlens.models import SmallCNN
from epochlens.tasks import ClassificationTask, LanguageModelTask

ACTIVE = np.arange(3)
METHODS = ["ekfac", "kfac", "diagonal", "identity"]


def _scores(model, x, y, method, active=ACTIVE, **settings_kw):
    settings = InfluenceSettings(method=method, fisher="expected", damping=1e-3, **settings_kw)
    factors = fit_factors(model, x, y, active, settings)
    pair = pairwise_influence(model, factors, x, y, x[:4], y[:4], active, settings)
    selfs = self_influence(model, factors, x, y, active, settings)
    return pair.scores, selfs.scores


# ---------------------------------------------------------------- in-place activations
class Block(nn.Module):
    """A residual block as torchvision writes it: conv -> ReLU(inplace) -> conv, out += x, ReLU(inplace)."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, 3, padding=1)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(2, 2, 3, padding=1)
        self.fc = nn.Linear(2, 3)
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.relu(self.conv1(x)))
        if self.inplace:
            out += x  # modifies conv2's output in place
        else:
            out = out + x
        return self.fc(self.relu(out).mean((2, 3)))


@pytest.mark.parametrize("method", METHODS)
def test_inplace_relu_after_tracked_layers_gives_the_out_of_place_scores(method) -> None:
    """ReLU(inplace=True) after conv1, ``out += x`` then ReLU(inplace) after conv2: same as out of place."""
    torch.manual_seed(50)
    a = Block(inplace=False).double().eval()
    b = Block(inplace=True).double().eval()
    b.load_state_dict(a.state_dict())
    x, y = data(10, (2, 4, 4), 3, 50)
    pa, sa = _scores(a, x, y, method)
    pb, sb = _scores(b, x, y, method)
    np.testing.assert_allclose(pb, pa, rtol=1e-12)
    np.testing.assert_allclose(sb, sa, rtol=1e-12)
    assert np.isfinite(pa).all() and (np.abs(pa) > 0).any()


def test_inplace_relu_of_a_sequential_mlp() -> None:
    """nn.Sequential(Linear, ReLU(inplace=True), Linear): once refused, now the out-of-place scores."""
    torch.manual_seed(51)
    a = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 3)).double().eval()
    b = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=True), nn.Linear(5, 3)).double().eval()
    b.load_state_dict(a.state_dict())
    x, y = data(12, (3,), 3, 51)
    for method in METHODS:
        np.testing.assert_allclose(_scores(b, x, y, method)[1], _scores(a, x, y, method)[1], rtol=1e-12)


# ---------------------------------------------------------------- a module called twice, tied modules
class Twice(nn.Module):
    """One Linear applied to two halves of the input, outputs summed: fc(x₁) + fc(x₂)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc(x[:, 0]) + self.fc(x[:, 1])))


class Tied(nn.Module):
    """The same with two modules sharing weight and bias (the unrolled, weight-tied form)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_a = nn.Linear(3, 4)
        self.fc_b = nn.Linear(3, 4)
        self.fc_b.weight = self.fc_a.weight
        self.fc_b.bias = self.fc_a.bias
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc_a(x[:, 0]) + self.fc_b(x[:, 1])))


class Stacked(nn.Module):
    """The same as one call over a token dimension of 2, summed over tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc(x).sum(1)))


@pytest.mark.parametrize("method", METHODS)
def test_module_called_twice_equals_tied_modules_and_a_token_dimension(method) -> None:
    """fc called twice, fc_a/fc_b tied, and fc over 2 tokens: three spellings, identical scores.

    Each is one layer whose positions are the two calls (the weight's gradient sums over them;
    A and S sum over them as over tokens), so all three give the same factors and scores.
    """
    torch.manual_seed(52)
    twice = Twice().double().eval()
    tied, stacked = Tied().double().eval(), Stacked().double().eval()
    with torch.no_grad():
        tied.fc_a.weight.copy_(twice.fc.weight)
        tied.fc_a.bias.copy_(twice.fc.bias)
        tied.out.load_state_dict(twice.out.state_dict())
    stacked.load_state_dict(twice.state_dict())
    x, y = data(12, (2, 3), 3, 52)
    assert list(select_layers(tied)) == ["fc_a", "out"] and select_layers(tied)["fc_a"].aliases == ("fc_b",)
    ref = _scores(twice, x, y, method)
    for other in (tied, stacked):
        got = _scores(other, x, y, method)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-10)
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-10)


class Recurrent(nn.Module):
    """h₂ = tanh(cell(tanh(cell(x)))): the second call's input depends on the first's output."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.cell(torch.tanh(self.cell(x)))))


def test_recurrent_module_gradients_and_diagonal_curvature_are_exact() -> None:
    """The per-sample gradients of a reused module sum both calls (autograd through the recurrence),
    and the diagonal method's D equals the exact GGN's diagonal."""
    torch.manual_seed(53)
    m = Recurrent().double().eval()
    x, y = data(10, (4,), 3, 53)
    ex = explicit_quantities(m, x, y, ACTIVE)
    grads = per_sample_gradients(m, x, y, ACTIVE)
    for name, sl in ex["slices"].items():
        torch.testing.assert_close(
            grads[name].reshape(len(x), -1), ex["grads"][:, sl], rtol=1e-10, atol=1e-12
        )
    factors = fit_factors(m, x, y, ACTIVE, InfluenceSettings(method="diagonal", fisher="expected"))
    ours = torch.cat([factors.layers[n].diagonal.reshape(-1) for n in ex["slices"]])
    torch.testing.assert_close(ours, torch.diagonal(ex["ggn"]), rtol=1e-9, atol=1e-14)


def test_tied_modules_with_different_biases_are_refused() -> None:
    m = Tied()
    m.fc_b.bias = nn.Parameter(torch.zeros(4))
    with pytest.raises(LayerSelectionError, match="'fc_a' and 'fc_b' share a weight but not their bias"):
        select_layers(m)
    assert list(select_layers(m, exclude=("fc_b",))) == ["out"]  # excluding one excludes the tied layer


# ---------------------------------------------------------------- layers that cannot be tracked
class WithAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        return self.head(h.mean(1))


def test_unsupported_layer_types_named_in_the_config_are_refused_with_the_supported_list() -> None:
    m = WithAttention()
    with pytest.raises(
        LayerSelectionError, match=r"names \['norm'\] of type LayerNorm.*supported types are nn.Linear"
    ):
        select_layers(m, ("norm",))
    with pytest.raises(LayerSelectionError, match=r"names \['embed'\] of type Embedding.*Conv1D"):
        select_layers(m, ("embed", "head"))
    # nn.MultiheadAttention applies its out_proj weight with F.linear, so the module never runs: it
    # is not a candidate by default, and naming it is refused, not skipped.
    assert list(select_layers(m)) == ["head"]
    with pytest.raises(LayerSelectionError, match=r"'attn\*' names \['attn', 'attn.out_proj'\].*F.linear"):
        select_layers(m, ("attn*",))
    with pytest.raises(LayerSelectionError, match=r"names \['attn.out_proj'\] of type out_proj of nn.Multi"):
        select_layers(m, ("attn.out_proj",))


class HiddenLinear(nn.Module):
    """Holds a Linear but applies its weight with F.linear: the module itself never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.head = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.linear(x, self.proj.weight, self.proj.bias))


def test_a_selected_layer_that_never_runs_is_an_error_not_a_skip() -> None:
    x, y = data(5, (3,), 3, 54)
    with pytest.raises(LayerSelectionError, match=r"'proj' never ran in the forward pass"):
        self_influence(HiddenLinear().double(), None, x, y, settings=InfluenceSettings(method="identity"))


def test_integer_inputs_reach_the_embedding_as_ids() -> None:
    """Token ids (int64) -> Embedding -> ...: scored without casting the ids to the float dtype."""
    torch.manual_seed(54)
    m = WithAttention().double().eval()
    ids = torch.randint(0, 7, (8, 5))
    y = np.arange(8) % 3
    settings = InfluenceSettings(method="ekfac", layers=("head",))
    factors = fit_factors(m, ids, y, settings=settings)
    selfs = self_influence(m, factors, ids, y, settings=settings)
    assert np.isfinite(selfs.scores).all() and (selfs.scores > 0).all()


class Flattening(nn.Module):
    """Reshapes (B, T, d) to (B·T, d) before its Linear: rows are no longer samples."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(-1, 4)).reshape(x.shape[0], -1, 3).mean(1)


def test_a_layer_that_mixes_samples_into_its_rows_is_refused() -> None:
    x, y = data(3, (5, 4), 3, 55)
    with pytest.raises(LayerSelectionError, match=r"'fc' received 15 rows for a batch of 3 samples"):
        self_influence(Flattening().double(), None, x, y, settings=InfluenceSettings(method="identity"))


# ---------------------------------------------------------------- the model is left as it was
def test_model_is_used_in_place_and_restored_exactly(monkeypatch) -> None:
    """No deep copy; training flags, requires_grad, dtypes, tensors and hooks restored; .grad untouched."""
    torch.manual_seed(56)
    m = SmallCNN(num_classes=4, in_channels=1).half().train()
    m.block1[0].weight.requires_grad_(False)  # a user's frozen layer
    before = {n: (p, p.data_ptr(), p.dtype, p.requires_grad) for n, p in m.named_parameters()}
    buffers = {n: b.clone() for n, b in m.named_buffers()}
    x = torch.randn(6, 1, 8, 8)
    y = np.arange(6) % 4

    real_deepcopy = copy.deepcopy

    def no_copy(obj, *args, **kwargs):
        if isinstance(obj, nn.Module):
            raise AssertionError("the model was deep-copied")
        return real_deepcopy(obj, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", no_copy)
    settings = InfluenceSettings(method="kfac")  # compute_dtype auto: float32 for a float16 model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factors = fit_factors(m, x, y, np.arange(4), settings)
        pairwise_influence(m, factors, x, y, x[:2], y[:2], np.arange(4), settings)
    for n, p in m.named_parameters():
        obj, ptr, dtype, flag = before[n]
        assert p is obj and p.data_ptr() == ptr and p.dtype == dtype and p.requires_grad == flag, n
        assert p.grad is None
    for n, b in m.named_buffers():
        torch.testing.assert_close(b, buffers[n], rtol=0, atol=0)
    assert all(mod.training for mod in m.modules())
    assert not any(mod._forward_hooks for mod in m.modules())


# ---------------------------------------------------------------- GPT-2's Conv1D
def _tiny_gpt2(tie: bool):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=8,
        vocab_size=11,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
        attn_implementation="eager",
    )
    torch.manual_seed(57)
    return transformers.GPT2LMHeadModel(config).double().eval()


def test_gpt2_conv1d_gradients_are_autograd_gradients_and_padding_changes_nothing() -> None:
    """GPT-2: every Conv1D (weight stored (in, out)) and the head tracked; per-sample gradients equal
    autograd's; EK-FAC scores finite and unchanged by appended padding."""
    m = _tiny_gpt2(tie=False)
    layers = select_layers(m)
    kinds = {n: i.kind for n, i in layers.items()}
    assert kinds["transformer.h.0.attn.c_attn"] == "conv1d" and kinds["lm_head"] == "linear"
    task = LanguageModelTask()
    train = token_batch(6, 11, 58)
    grads = per_sample_gradients(m, DictDataset(train), task=task)
    inputs = {k: train[k] for k in ("input_ids", "attention_mask")}
    ex = explicit_task_quantities(m, task, inputs, train["labels"])
    for name, sl in ex["slices"].items():
        torch.testing.assert_close(grads[name].reshape(6, -1), ex["grads"][:, sl], rtol=1e-8, atol=1e-12)
    w = gradient_to_parameters(layers["transformer.h.0.mlp.c_fc"], grads["transformer.h.0.mlp.c_fc"])
    assert w["weight"].shape == (6, 8, 32)  # (in, out) as Conv1D stores it
    settings = InfluenceSettings(method="ekfac", damping=1e-3)
    got = []
    for extra in (0, 2):
        ds = DictDataset(token_batch(6, 11, 58, extra_pad=extra))
        factors = fit_factors(m, ds, settings=settings, task=task)
        got.append(self_influence(m, factors, ds, settings=settings, task=task).scores)
    assert np.isfinite(got[0]).all()
    np.testing.assert_allclose(got[1], got[0], rtol=1e-9)


def test_gpt2_head_tied_to_the_embedding_is_noted() -> None:
    m = _tiny_gpt2(tie=True)
    info = select_layers(m)["lm_head"]
    assert "transformer.wte (Embedding)" in info.note
    task = LanguageModelTask()
    ds = DictDataset(token_batch(4, 11, 59))
    selfs = self_influence(m, None, ds, settings=InfluenceSettings(method="identity"), task=task)
    note = selfs.diagnostics.set_index("layer").loc["lm_head", "note"]
    assert "not tracked" in note and np.isfinite(selfs.scores).all()


def test_mlp_layers_unchanged_by_the_capture_rewrite() -> None:
    """Sanity: a plain MLP still has one call per layer and no decoupling."""
    m = MLP(3, 4, 3).double().eval()
    x, y = data(5, (3,), 3, 60)
    assert np.isfinite(_scores(m, x, y, "ekfac")[1]).all()


class ViTish(nn.Module):
    """Patch embedding, a PyTorch TransformerEncoderLayer (attention + LayerNorm), mean pool, head."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Linear(4, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.patch(x)).mean(1))


def test_transformer_encoder_layer_tracks_its_linears_with_exact_gradients() -> None:
    """nn.TransformerEncoderLayer in eval mode: its MLP Linears are tracked (the attention's out_proj
    is left out: F.linear), the per-sample gradients are autograd's, EK-FAC scores are finite."""
    torch.manual_seed(61)
    m = ViTish().double().eval()
    assert list(select_layers(m)) == ["patch", "enc.linear1", "enc.linear2", "head"]
    x, y = data(6, (5, 4), 3, 61)
    task = ClassificationTask(None)
    selfs = self_influence(m, None, x, y, settings=InfluenceSettings(method="identity"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # functorch's batching-rule performance note for SDPA
        ex = explicit_task_quantities(m, task, x, torch.as_tensor(y))
    np.testing.assert_allclose(selfs.scores, (ex["grads"] ** 2).sum(1).numpy(), rtol=1e-10)
    settings = InfluenceSettings(method="ekfac")
    factors = fit_factors(m, x, y, settings=settings)
    assert np.isfinite(self_influence(m, factors, x, y, settings=settings).scores).all()
