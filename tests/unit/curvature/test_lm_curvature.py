"""Curvature of a causal language model with respect to its input embeddings (float64 tiny GPT-2
LM head model): the per-sample loss is transformers' own loss of the sample alone (the mean NLL of
its target tokens), correct is exact match, the exact mode equals h·H v with H the explicit Hessian
of that loss in the space of the sample's real-token embeddings; padding and batch size change no
result; a sample without a target token is not computed. Results are float32: compared to float32
precision."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from epochlens.curvature.estimator import per_sample_curvature, token_directions
from epochlens.curvature.settings import CurvatureSettings
from epochlens.formats.user_model import attach_output_adapter
from epochlens.outcome import IGNORE_INDEX, sequence_outcome

VOCAB, PAD, D = 12, 0, 8
# (prompt, target) token ids; the last sample has no target token
SAMPLES = [([3, 4], [5, 6]), ([7], [8]), ([9, 10], [11]), ([4, 4, 6], [7, 8]), ([5, 3], [])]
INDICES = np.arange(len(SAMPLES)) + 10


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """(transformers' model, the same with epochlens' output adapter: logits)."""
    config = GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=1, n_head=2, n_inner=16, n_positions=16,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD,
                        attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    raw = GPT2LMHeadModel(config).double().eval()
    adapted = copy.deepcopy(raw)
    attach_output_adapter(adapted, "logits")
    return raw, adapted


def padded(length: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """input_ids, attention_mask (right padding) and token labels (-100 on prompt and padding)."""
    ids = torch.full((len(SAMPLES), length), PAD)
    mask = torch.zeros_like(ids)
    labels = np.full((len(SAMPLES), length), IGNORE_INDEX, dtype=np.int64)
    for i, (prompt, target) in enumerate(SAMPLES):
        n = len(prompt) + len(target)
        ids[i, :n], mask[i, :n] = torch.tensor(prompt + target), 1
        labels[i, len(prompt) : n] = target
    return ids, mask, labels


def curvature(model, ids, mask, labels, **settings) -> dict[str, np.ndarray]:
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    settings = CurvatureSettings(**{"n_directions": 3, "h": 1e-4, "seed": 5, **settings})
    tokens = {"input_ids": ids, "attention_mask": mask}
    return per_sample_curvature(model, embeds, labels, INDICES, np.array([0]), settings, "cpu", tokens=tokens)


def test_loss_is_transformers_loss_and_correct_is_exact_match(models):
    raw, adapted = models
    ids, mask, labels = padded(6)
    got = curvature(adapted, ids, mask, labels)
    for k in range(len(SAMPLES) - 1):
        with torch.no_grad():
            own = raw(
                input_ids=ids[k : k + 1],
                attention_mask=mask[k : k + 1],
                labels=torch.tensor(labels[k : k + 1]),
            )
        np.testing.assert_allclose(got["loss"][k], own.loss.item(), rtol=2e-7)
    with torch.no_grad():
        hit, loss = sequence_outcome(adapted(input_ids=ids, attention_mask=mask), torch.tensor(labels))
    np.testing.assert_array_equal(got["correct"], hit.numpy())
    # no target token: not computed
    assert all(np.isnan(got[key][-1]) for key in ("curvature", "directional_eig", "loss", "grad_norm"))
    assert np.isfinite(got["curvature"][:-1]).all() and not got["correct"][-1]
    # the temperature divides the logits
    hot = curvature(adapted, ids, mask, labels, temperature=2.0)
    with torch.no_grad():
        _, loss2 = sequence_outcome(adapted(input_ids=ids, attention_mask=mask) / 2.0, torch.tensor(labels))
    np.testing.assert_allclose(hot["loss"][:-1], loss2.numpy()[:-1], rtol=2e-7)


def test_exact_mode_equals_the_explicit_hessian_of_the_real_token_embeddings(models):
    raw, adapted = models
    length, h = 6, 1e-3
    ids, mask, labels = padded(length)
    got = curvature(adapted, ids, mask, labels, mode="exact", h=h)
    for k in range(len(SAMPLES) - 1):
        n = int(mask[k].sum())
        full = raw.get_input_embeddings()(ids[k : k + 1]).detach()

        def loss(real, k=k, n=n, full=full):  # transformers' loss of sample k at its real embeddings
            x = torch.cat([real.view(1, n, D), full[:, n:]], dim=1)
            hook = raw.get_input_embeddings().register_forward_hook(lambda m, i, o: x)
            out = raw(
                input_ids=ids[k : k + 1],
                attention_mask=mask[k : k + 1],
                labels=torch.tensor(labels[k : k + 1]),
            )
            hook.remove()
            return out.loss

        real0 = full[0, :n].flatten()
        hess = torch.autograd.functional.hessian(loss, real0)
        grad = torch.autograd.functional.jacobian(loss, real0)
        v = token_directions(5, INDICES[k : k + 1], mask[k : k + 1], D, 3, torch.float64)[0]
        v = v[:, :n].reshape(3, -1)
        delta = h * v @ hess  # h·H v per direction (H symmetric)
        np.testing.assert_allclose(got["curvature"][k], delta.norm(dim=1).mean().item(), rtol=2e-7)
        np.testing.assert_allclose(got["directional_eig"][k], h * (v * delta).sum(1).mean().item(), rtol=1e-6)
        np.testing.assert_allclose(got["grad_norm"][k], grad.norm().item(), rtol=2e-7)
        np.testing.assert_allclose(got["loss"][k], loss(real0).item(), rtol=2e-7)


@pytest.mark.parametrize("mode", ["finite_difference", "exact"])
def test_padding_and_batch_size_change_no_result(models, mode):
    _, adapted = models
    reference = curvature(adapted, *padded(5), batch_size=5, mode=mode)
    for length, batch in ((9, 1), (6, 2)):
        other = curvature(adapted, *padded(length), batch_size=batch, mode=mode)
        for key in ("curvature", "directional_eig", "loss", "grad_norm"):
            np.testing.assert_allclose(other[key], reference[key], rtol=2e-7, atol=1e-12, err_msg=key)
        np.testing.assert_array_equal(other["correct"], reference["correct"])
