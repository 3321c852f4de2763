"""LDS retrainings of a text-to-text (encoder-decoder) model trained by the pipeline: a tiny T5
built from its config, prompts in, decoder labels (-100 padded) as targets. What a retraining
measures for each query is its test sample's loss under its own target, the mean NLL of its target
tokens: transformers' own ``model(input_ids, labels=labels).loss`` of that sample alone; with every
training sample kept a retraining is the run's own training; a subset's differs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.data.text import IGNORE_INDEX, TextDataset
from epochlens.schedule import ClassSchedule
from epochlens.training import TrainSettings, train_incremental

pytest.importorskip("transformers")

T5 = {"model_type": "t5", "d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1, "num_heads": 2,
      "dropout_rate": 0.0, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}  # fmt: skip
MODEL = {"hf": {"config": T5, "task": "text_to_text", "attention": "eager"}}
VOCAB = 24


def samples(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts of 2..7 tokens (0-padded) and targets of 1..2 tokens and eos (-100-padded): the
    target repeats the prompt's first token, so that there is something to learn."""
    lengths = rng.integers(2, 8, size=n)
    mask = (np.arange(7)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(2, VOCAB, size=(n, 7)), 0)
    labels = np.full((n, 3), IGNORE_INDEX, dtype=np.int64)
    two = rng.random(n) < 0.5
    labels[:, 0] = ids[:, 0]
    labels[:, 1] = np.where(two, ids[:, 1], 1)
    labels[two, 2] = 1
    return ids, mask, labels


@pytest.fixture(scope="module")
def data() -> TextDataset:
    rng = np.random.default_rng(0)
    (a, am, ay), (b, bm, by) = samples(rng, 40), samples(rng, 10)
    return TextDataset(
        name="tiny_t2t", source="test", kind="text_to_text", train_input_ids=a, train_attention_mask=am,
        train_labels=ay, test_input_ids=b, test_attention_mask=bm, test_labels=by, pad_token_id=0,
        vocab_size=VOCAB, holdout=np.arange(40) >= 34, train_text=[f"s{i}" for i in range(40)],
    )  # fmt: skip


SCHEDULE = ClassSchedule(np.arange(1), 1, 0, 3)  # one class (the target tokens), 3 epochs
SETTINGS = TrainSettings(optimizer="adamw", batch_size=8, lr=0.01, weight_decay=0.0, seed=2)


def build(data):
    from epochlens.models.build import build_untrained

    return build_untrained(MODEL, data, SETTINGS.seed)


def own_losses(state: dict, data: TextDataset) -> np.ndarray:
    """transformers' loss of each test sample alone (unpadded prompt and target), float64 model."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(**{k: v for k, v in T5.items() if k != "model_type"},
                                                vocab_size=VOCAB))  # fmt: skip
    model.load_state_dict(state)
    model.double().eval()
    out = []
    with torch.no_grad():
        for k in range(len(data.test_labels)):
            ids = torch.as_tensor(data.test_input_ids[k][data.test_attention_mask[k] == 1])[None]
            labels = torch.as_tensor(data.test_labels[k][data.test_labels[k] != IGNORE_INDEX])[None]
            out.append(float(model(input_ids=ids, labels=labels).loss))
    return np.array(out)


def test_subset_data_removes_the_rows_of_samples_left_out_keeping_the_holdout(data) -> None:
    from epochlens.study.retrain import subset_data

    keep = np.zeros(40, bool)
    keep[[2, 5, 6, 30]] = True
    sub = subset_data(data, keep)
    rows = [2, 5, 6, 30, 34, 35, 36, 37, 38, 39]
    np.testing.assert_array_equal(sub.train_labels, data.train_labels[rows])
    np.testing.assert_array_equal(sub.train_input_ids, data.train_input_ids[rows])
    np.testing.assert_array_equal(sub.train_attention_mask, data.train_attention_mask[rows])
    np.testing.assert_array_equal(sub.holdout, data.holdout[rows])
    assert sub.train_text == [f"s{i}" for i in rows]
    np.testing.assert_array_equal(sub.test_labels, data.test_labels)
    with pytest.raises(ValueError, match="subset mask of shape"):
        subset_data(data, keep[:-1])


def test_retraining_measures_transformers_loss_and_on_every_sample_is_the_runs_training(
    data, tmp_path
) -> None:
    from epochlens.study.retrain import retrain_part, retrain_subsets, test_sequence_losses

    run = build(data)
    train_incremental(run, data, SCHEDULE, SETTINGS, lambda e: tmp_path / f"run_{e}.pt", progress=False)
    state = torch.load(tmp_path / "run_3.pt", weights_only=True)
    run.load_state_dict(state)
    reference = test_sequence_losses(run, data, torch.device("cpu"))
    assert reference.dtype == np.float64 and reference.shape == (10,)
    # the measured query loss is transformers' own loss of that sample alone (the float32 model's
    # logits, padded, against the float64 model on the sample alone)
    np.testing.assert_allclose(reference, own_losses(state, data), rtol=1e-5)
    got = retrain_subsets(
        build_fn(data), data, SCHEDULE, SETTINGS, 3, (~data.holdout)[None], scratch=tmp_path
    )
    np.testing.assert_array_equal(got[0], reference)  # every sample kept: the run's own training
    part = retrain_part(
        build_fn(data), data, SCHEDULE, SETTINGS, 3, {"subsets": 3, "fraction": 0.5, "seed": 0}, 1, 2
    )
    assert set(part) == {"subset_ids", "masks", "test_losses"}
    assert part["test_losses"].shape == (1, 10) and np.isfinite(part["test_losses"]).all()
    assert part["masks"].sum() == 17 and not (part["masks"] & data.holdout).any()
    assert not np.allclose(part["test_losses"][0], reference)  # half the samples: another model


def build_fn(data):
    return lambda: build(data)
