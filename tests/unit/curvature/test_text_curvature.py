"""Curvature of a text model with respect to its input embeddings (float64 tiny BERT and GPT-2):
the exact mode equals h·H v with H the explicit Hessian of the per-sample loss in embedding space,
with the same token directions; padding changes no result (nor, for the directions, its side);
batch size none.
Results are float32 (computed in float64 here): compared to float32 precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.curvature.estimator import per_sample_curvature, token_directions
from epochlens.curvature.settings import CurvatureSettings
from epochlens.formats.user_model import attach_output_adapter
from epochlens.models.hf import build_hf_model

VOCAB, PAD, D = 12, 0, 8
ACTIVE = np.array([0, 1, 2])
SENTENCES = [[3, 4, 5, 6], [7, 8], [9, 10, 11], [4, 4, 6, 7, 8]]  # token ids, no padding
LABELS = np.array([0, 2, 1, 2])


def tiny(model_type: str) -> torch.nn.Module:
    if model_type == "bert":
        config = {"model_type": "bert", "hidden_size": D, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "intermediate_size": 16, "max_position_embeddings": 16}  # fmt: skip
    else:
        config = {
            "model_type": "gpt2",
            "n_embd": D,
            "n_layer": 1,
            "n_head": 2,
            "n_inner": 16,
            "n_positions": 16,
        }
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0)  # fmt: skip
    model = build_hf_model(config, "sequence_classification", 3, PAD, seed=0, vocab_size=VOCAB).double()
    attach_output_adapter(model, "logits")
    return model


def padded(length: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(SENTENCES), length), PAD)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(SENTENCES):
        where = slice(length - len(s), length) if left else slice(0, len(s))
        ids[i, where], mask[i, where] = torch.tensor(s), 1
    return ids, mask


def curvature(model, ids, mask, **settings) -> dict[str, np.ndarray]:
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    settings = CurvatureSettings(**{"n_directions": 3, "h": 1e-4, "seed": 5, **settings})
    tokens = {"input_ids": ids, "attention_mask": mask}
    return per_sample_curvature(model, embeds, LABELS, np.arange(len(ids)) + 10, ACTIVE, settings, "cpu",
                                tokens=tokens)  # fmt: skip


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_exact_mode_equals_the_explicit_hessian_in_embedding_space(model_type):
    model = tiny(model_type)
    ids, mask = padded(6)
    h = 1e-3
    got = curvature(model, ids, mask, mode="exact", h=h)
    for k in range(len(ids)):
        x0 = model.get_input_embeddings()(ids[k : k + 1]).detach()

        def loss(x, k=k):
            hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o, x=x: x.view(1, 6, D))
            logits = model(input_ids=ids[k : k + 1], attention_mask=mask[k : k + 1])
            hook.remove()
            return torch.nn.functional.cross_entropy(logits, torch.tensor([int(LABELS[k])]))

        hess = torch.autograd.functional.hessian(loss, x0.flatten()).reshape(6 * D, 6 * D)
        grad = torch.autograd.functional.jacobian(loss, x0.flatten())
        v = token_directions(5, np.array([10 + k]), mask[k : k + 1], D, 3, torch.float64)[0].reshape(3, -1)
        delta = h * v @ hess  # h·H v per direction (H symmetric)
        np.testing.assert_allclose(got["curvature"][k], delta.norm(dim=1).mean().item(), rtol=2e-7)
        np.testing.assert_allclose(got["directional_eig"][k], h * (v * delta).sum(1).mean().item(), rtol=1e-6)
        np.testing.assert_allclose(got["grad_norm"][k], grad.norm().item(), rtol=2e-7)
        np.testing.assert_allclose(got["loss"][k], loss(x0.flatten()).item(), rtol=2e-7)
        # Nothing reaches the padding: its rows of the gradient and of the Hessian are zero.
        padding = (~mask[k].bool()).repeat_interleave(D)
        assert grad[padding].abs().max() == 0 and hess[padding].abs().max() == 0


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_padding_and_batch_size_change_no_result(model_type):
    model = tiny(model_type)
    reference = curvature(model, *padded(5), batch_size=4)
    for ids, mask, batch in ((*padded(9), 1), (*padded(6), 3)):
        other = curvature(model, ids, mask, batch_size=batch)
        for key in ("curvature", "directional_eig", "loss", "grad_norm"):
            np.testing.assert_allclose(other[key], reference[key], rtol=2e-7, atol=1e-12, err_msg=key)


def test_token_directions_cover_the_real_tokens_only_whatever_the_padding():
    # (Results under left padding differ for BERT and GPT-2: their position ids shift with it.)
    _, left = padded(7, left=True)
    _, right = padded(5)
    v_left = token_directions(0, np.arange(4), left, D, 2)
    v_right = token_directions(0, np.arange(4), right, D, 2)
    real = left.bool()[:, None].expand(-1, 2, -1)
    assert set(v_left[real].unique().tolist()) == {-1.0, 1.0} and v_left[~real].abs().max() == 0
    for k, sentence in enumerate(SENTENCES):
        np.testing.assert_array_equal(v_left[k, :, -len(sentence) :], v_right[k, :, : len(sentence)])


def test_embeddings_looked_up_a_batch_at_a_time_give_the_same_results():
    """A shard's input embeddings are looked up as the estimator reads them (curvature_inputs):
    the same numbers as the whole shard's embeddings computed at once, and no read but the
    finiteness check's holds more than a batch."""
    from epochlens.curvature.distributed import InputEmbeddings

    model = tiny("gpt2")
    ids, mask = padded(6)
    tokens = {"input_ids": ids, "attention_mask": mask}
    settings = CurvatureSettings(n_directions=3, seed=5, batch_size=2)
    lookup, reads = model.get_input_embeddings(), []
    with torch.no_grad():  # what curvature_inputs gave before: the shard's float32 embeddings
        whole = lookup(ids).float()
    eager = per_sample_curvature(model, whole, LABELS, np.arange(4), ACTIVE, settings, "cpu", tokens=tokens)

    class Counted(InputEmbeddings):
        def __getitem__(self, rows):
            reads.append(len(self.input_ids[rows]))
            return super().__getitem__(rows)

    lazy = Counted(lookup, ids)
    assert lazy.shape == (4, 6, D) and reads == [1]  # one row read for the width
    got = per_sample_curvature(model, lazy, LABELS, np.arange(4), ACTIVE, settings, "cpu", tokens=tokens)
    for key in eager:
        np.testing.assert_array_equal(got[key], eager[key])
    assert reads[1] == 4 and max(reads[2:]) <= 2  # the finiteness check, then batches
