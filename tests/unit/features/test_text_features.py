"""Features of text runs against exact answers on tiny float64 transformers (BERT- and GPT-2-style
sequence classifiers built from configs): the mean over real tokens and the last real token of
every block's hidden states, padding and batch size changing nothing, and the per-epoch cache."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from epochlens.data.text import TextDataset
from epochlens.errors import ConfigError, FeatureError, LayerError
from epochlens.features.cache import FeatureSet
from epochlens.features.text import (
    default_text_layers,
    extract_text_features,
    last_positions,
    load_or_extract_text,
    text_representations,
)
from epochlens.features.text_settings import TextFeatureSettings, text_feature_params
from epochlens.probes.linear import probe_features
from epochlens.probes.settings import ProbeSettings

transformers = pytest.importorskip("transformers")
VOCAB, PAD, T = 40, 0, 9
CKPT = "c" * 64


def tiny_bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=32, num_labels=2, pad_token_id=PAD, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).double().eval()


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32, num_labels=2, pad_token_id=PAD,
        bos_token_id=1, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2ForSequenceClassification(config).double().eval()


MODELS = {"bert": tiny_bert, "gpt2": tiny_gpt2}
BLOCKS = {
    "bert": ["bert.encoder.layer.0", "bert.encoder.layer.1"],
    "gpt2": ["transformer.h.0", "transformer.h.1"],
}


def batch(rng: np.random.Generator, n: int = 7, length: int = T) -> dict[str, torch.Tensor]:
    """Right-padded sequences of 1..length real tokens (ids 2..VOCAB-1), pad id 0."""
    lengths = rng.integers(1, length + 1, size=n)
    lengths[0] = length  # one without padding
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(2, VOCAB, size=(n, length)), PAD)
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def block_outputs(model: nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Every block's output by Hugging Face's own ``output_hidden_states`` (B, T, D) each."""
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    return list(out.hidden_states[1:])


@pytest.fixture(params=sorted(MODELS))
def family(request) -> str:
    return request.param


@pytest.fixture
def model(family: str) -> nn.Module:
    net = MODELS[family]()
    if family == "gpt2":
        # hidden_states[-1] of GPT-2 is ln_f(last block's output); without ln_f it is the output.
        net.transformer.ln_f = nn.Identity()
    return net


def test_representations_of_one_batch_by_hand():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float64).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])  # right and left padding
    reps = text_representations(hidden, mask)
    torch.testing.assert_close(reps["mean"], torch.tensor([[1.0, 2.0], [9.0, 10.0]], dtype=torch.float64))
    torch.testing.assert_close(reps["last"], torch.tensor([[2.0, 3.0], [10.0, 11.0]], dtype=torch.float64))
    assert last_positions(mask).tolist() == [1, 2]
    with pytest.raises(FeatureError, match=r"sequences \[1\] .* no real token"):
        text_representations(hidden, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_default_layers_are_the_blocks(family, model):
    assert default_text_layers(model) == BLOCKS[family]


def test_mean_and_last_equal_hidden_states_by_hand(family, model, rng):
    inputs = batch(rng)
    feats = extract_text_features(model, inputs, batch_size=3)
    assert list(feats) == BLOCKS[family]
    mask = inputs["attention_mask"].numpy()
    for layer, hidden in zip(BLOCKS[family], block_outputs(model, inputs), strict=True):
        h = hidden.numpy()
        assert feats[layer]["mean"].dtype == np.float64
        for b in range(len(h)):
            real = np.flatnonzero(mask[b])
            np.testing.assert_allclose(feats[layer]["mean"][b], h[b, real].mean(0), rtol=0, atol=1e-12)
            np.testing.assert_array_equal(feats[layer]["last"][b], h[b, real[-1]])


def test_the_last_token_is_what_gpt2_classifies():
    model, rng = tiny_gpt2(), np.random.default_rng(1)
    inputs = batch(rng)
    feats = extract_text_features(model, inputs, layers=["transformer.ln_f"], names=["last"])
    with torch.no_grad():
        logits = model(**inputs).logits
    scores = torch.from_numpy(feats["transformer.ln_f"]["last"]) @ model.score.weight.T
    torch.testing.assert_close(scores, logits, rtol=0, atol=1e-12)


def test_padding_columns_change_nothing(model, rng):
    inputs = batch(rng)
    padded = {
        "input_ids": torch.nn.functional.pad(inputs["input_ids"], (0, 5), value=PAD),
        "attention_mask": torch.nn.functional.pad(inputs["attention_mask"], (0, 5), value=0),
    }
    a, b = extract_text_features(model, inputs), extract_text_features(model, padded)
    for layer in a:
        for r in ("mean", "last"):
            np.testing.assert_allclose(b[layer][r], a[layer][r], rtol=0, atol=1e-12)


def test_batch_size_changes_nothing(model, rng):
    inputs = batch(rng, n=10)
    whole = extract_text_features(model, inputs, batch_size=10)
    for size in (1, 3, 4):
        parts = extract_text_features(model, inputs, batch_size=size)
        for layer in whole:
            for r in ("mean", "last"):
                np.testing.assert_allclose(parts[layer][r], whole[layer][r], rtol=0, atol=1e-12)


def test_a_module_that_is_not_a_block_is_named(rng):
    model = tiny_bert()
    with pytest.raises(LayerError, match="bert.pooler.*not hidden states"):
        extract_text_features(model, batch(rng), layers=["bert.pooler"])
    with pytest.raises(LayerError, match="has no layer"):
        extract_text_features(model, batch(rng), layers=["bert.encoder.layer.7"])


def text_data(rng: np.random.Generator, tokenizer: str = "tok sha256:0") -> TextDataset:
    train, test = batch(rng, n=24), batch(rng, n=10)
    return TextDataset(
        name="tiny_text", source="test", kind="classification",
        train_input_ids=train["input_ids"].numpy(), train_attention_mask=train["attention_mask"].numpy(),
        train_labels=np.arange(24) % 2, test_input_ids=test["input_ids"].numpy(),
        test_attention_mask=test["attention_mask"].numpy(), test_labels=np.arange(10) % 2,
        num_classes=2, tokenizer=tokenizer, pad_token_id=PAD, vocab_size=VOCAB,
        holdout=np.arange(24) >= 18,
    )  # fmt: skip


def test_cache_holds_the_features_in_the_image_format(tmp_path, rng):
    model, data = tiny_bert().float(), text_data(rng)
    path = tmp_path / "epoch_0001.h5"
    built = []

    def build():
        built.append(1)
        return model

    settings = TextFeatureSettings(batch_size=5)
    first = load_or_extract_text(path, build, data, CKPT, settings)
    assert not first.hit and first.reason == "no cached file" and built == [1]
    fs = first.features
    assert fs.layers == BLOCKS["bert"] and fs.representations == ["mean", "last"]
    assert fs.attrs["data_content_hash"] == data.content_hash and fs.attrs["kind"] == "text"
    assert fs.shape("bert.encoder.layer.0") == (16, T)
    np.testing.assert_array_equal(fs.labels("train"), data.train_labels)
    want = extract_text_features(model, data.inputs("test"))
    got = fs.array("test", "bert.encoder.layer.1", "last")
    np.testing.assert_allclose(got, want["bert.encoder.layer.1"]["last"], rtol=0, atol=1e-6)
    # a hit reads the file without building the model; batch size is not part of the key
    again = load_or_extract_text(path, build, data, CKPT, TextFeatureSettings(batch_size=64))
    assert again.hit and built == [1]
    # another tokenizer (the same ids) is another data set: the file is rebuilt
    retokenised = dataclasses.replace(data, tokenizer="tok2 sha256:1")
    other = load_or_extract_text(path, build, retokenised, CKPT, settings)
    assert not other.hit and "data changed" in other.reason
    with h5py.File(path) as f:
        assert f["train/bert.encoder.layer.0/mean"].shape == (24, 16)
    # probes read it as they read image features
    targets = {"class": {"train": data.train_labels, "test": data.test_labels}}
    settings = ProbeSettings(seeds=(0,), max_epochs=2)
    table = probe_features(FeatureSet(path), targets, data.holdout, settings, device="cpu")
    assert set(table["representation"]) == {"mean", "last"} and table["accuracy"].notna().all()


def test_settings_and_params():
    run = {"features": {"layers": None, "dtype": "float16", "representations": ["pooled"]}}
    want = {"layers": None, "representations": {"names": ["mean", "last"]}, "dtype": "float16"}
    assert text_feature_params(run) == want
    spec = TextFeatureSettings().spec()
    assert spec["kind"] == "text" and spec["layers"] == "default_blocks"
    with pytest.raises(ConfigError, match="representations"):
        TextFeatureSettings(names=("pooled",))
    with pytest.raises(FeatureError, match="causal_lm"):
        ids = np.ones((2, 3), dtype=np.int64)
        data = TextDataset(name="lm", source="t", kind="causal_lm", train_input_ids=ids,
                           train_attention_mask=ids, train_labels=ids, test_input_ids=ids,
                           test_attention_mask=ids, test_labels=ids)  # fmt: skip
        load_or_extract_text("unused.h5", nn.Identity(), data, CKPT)
