"""A causal LM's per-sample outcome (epochlens.outcome) against transformers' own loss: a tiny GPT-2
whose samples are a prompt (labels -100) and a target, right-padded in one batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.outcome import IGNORE_INDEX, sample_classes, sequence_outcome


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=13, n_embd=16, n_layer=1, n_head=2, n_positions=16, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2)  # fmt: skip
    return GPT2LMHeadModel(config).double().eval()


def batch(lengths, prompts):
    gen = torch.Generator().manual_seed(1)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    labels = torch.full_like(ids, IGNORE_INDEX)
    mask = torch.zeros_like(ids)
    for i, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        ids[i, :n] = torch.randint(1, 13, (n,), generator=gen)
        labels[i, p:n] = ids[i, p:n]
        mask[i, :n] = 1
    return ids, mask, labels


def test_loss_is_transformers_loss_of_each_sample_alone(gpt2):
    ids, mask, labels = batch([7, 4, 9], [3, 2, 5])
    with torch.no_grad():
        correct, loss = sequence_outcome(gpt2(input_ids=ids, attention_mask=mask).logits, labels)
        for i, n in enumerate([7, 4, 9]):
            alone = gpt2(input_ids=ids[i : i + 1, :n], labels=labels[i : i + 1, :n])
            # transformers computes its loss in float32 (it upcasts the logits), ours in float64
            torch.testing.assert_close(loss[i], alone.loss.double(), rtol=1e-6, atol=0)
            predicted = alone.logits[0, :-1].argmax(-1)
            target = labels[i, 1:n]
            assert bool(correct[i]) == bool((predicted == target)[target != IGNORE_INDEX].all())
    assert loss.dtype == torch.float64 and correct.dtype == torch.bool


def test_exact_match_needs_every_target_token_and_a_target():
    logits = torch.zeros(3, 4, 5)
    logits[:, :, 2] = 1.0  # every position predicts token 2
    labels = torch.tensor([[IGNORE_INDEX, 2, 2, 2], [IGNORE_INDEX, IGNORE_INDEX, 2, 3], [IGNORE_INDEX] * 4])
    correct, loss = sequence_outcome(logits, labels)
    assert correct.tolist() == [True, False, False]
    expected = -torch.log_softmax(logits[0, 0].double(), 0)
    torch.testing.assert_close(loss[0], expected[2])
    torch.testing.assert_close(loss[1], (expected[2] + expected[3]) / 2)
    assert torch.isnan(loss[2])  # a sample without a target token has no loss


def test_a_causal_lms_samples_are_one_class():
    assert sample_classes(np.array([3, 1])).tolist() == [3, 1]
    assert sample_classes(np.full((2, 5), IGNORE_INDEX)).tolist() == [0, 0]
