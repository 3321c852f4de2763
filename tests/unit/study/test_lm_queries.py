"""A causal LM's influence queries (the test prompts with their targets) and probe targets (its
data groups), on a tiny GPT-2 built from a config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.data.text import IGNORE_INDEX, TextDataset
from epochlens.errors import ConfigError, ProbeError
from epochlens.probes.targets import select_lm_targets
from epochlens.study.queries import select_lm_queries

transformers = pytest.importorskip("transformers")


def lm_data(n_test: int = 9) -> TextDataset:
    rng = np.random.default_rng(0)

    def split(n):
        ids = rng.integers(2, 20, (n, 6))
        mask = np.ones((n, 6), dtype=np.int64)
        mask[::2, 5] = 0  # some right padding
        labels = np.full((n, 6), IGNORE_INDEX)
        labels[:, 3:5] = ids[:, 3:5]
        return ids, mask, labels

    (a, b, c), (d, e, f) = split(12), split(n_test)
    return TextDataset(
        name="lm", source="t", kind="causal_lm", train_input_ids=a, train_attention_mask=b, train_labels=c,
        test_input_ids=d, test_attention_mask=e, test_labels=f, vocab_size=20,
    )  # fmt: skip


def test_queries_are_test_prompts_under_their_targets_with_the_models_top_tokens():
    config = transformers.GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=8)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    data = lm_data()
    q = select_lm_queries(model, data, torch.device("cpu"), "all", max_count=5, seed=1)
    assert len(q.test_indices) == 5 and (np.diff(q.test_indices) > 0).all() and q.candidates == 9
    np.testing.assert_array_equal(q.labels, data.test_labels[q.test_indices])
    assert q.sign == -1.0 and not q.triggered
    with torch.no_grad():
        logits = model(**data.inputs("test", q.test_indices)).logits
    top = logits[:, :-1].argmax(2).numpy()
    target = q.labels[:, 1:] != IGNORE_INDEX
    np.testing.assert_array_equal(q.predicted[:, 1:][target], top[target])
    assert (q.predicted[:, 1:][~target] == IGNORE_INDEX).all() and (q.predicted[:, 0] == IGNORE_INDEX).all()
    every = select_lm_queries(model, data, torch.device("cpu"), "all", max_count=50)
    np.testing.assert_array_equal(every.test_indices, np.arange(9))
    with pytest.raises(ConfigError, match="select: all"):
        select_lm_queries(model, data, torch.device("cpu"), "misclassified")


def test_probe_targets_of_a_language_model_are_its_groups_and_curvature():
    groups = {"train": np.array([0, 1, 2, 0, 1, 2]), "test": np.array([2, 1])}
    fit = np.array([True] * 5 + [False])
    curvature = np.array([0.1, 0.5, 0.2, 0.9, np.nan, 0.3])
    targets, skipped = select_lm_targets(groups, ["group", "curvature"], curvature, 2, fit)
    np.testing.assert_array_equal(targets["group"]["test"], [2, 1])
    np.testing.assert_array_equal(targets["curvature_q2"]["train"], [0, 1, 0, 1, -1, 1])
    assert skipped == {}
    targets, skipped = select_lm_targets(None, ["group", "curvature"], None, 4, fit)
    assert targets == {} and "group_column" in skipped["group"] and "not computed" in skipped["curvature_q4"]
    _, skipped = select_lm_targets(groups, ["curvature"], curvature, 2, np.ones(6, bool))
    assert "no training holdout" in skipped["curvature_q2"]
    with pytest.raises(ProbeError, match=r"\['class'\] are not a language model's"):
        select_lm_targets(groups, ["class"], None, 4, fit)
