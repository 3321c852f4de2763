"""Features of a text-to-text (encoder-decoder) model against transformers' own
``output_hidden_states``, on a tiny T5 built from a config: each encoder block's ``mean`` (over the
prompt's real tokens) and ``first`` (the prompt's first token), each decoder block's ``mean`` (over
the target positions, teacher-forced with the decoder labels) and ``first`` (position 0, the start
token's output); padding in the batch changes nothing; the cache writes them in the features file
with the decoder blocks, and probes of the groups read it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from epochlens.data.text import IGNORE_INDEX, TextDataset
from epochlens.errors import FeatureError
from epochlens.features.cache import FeatureSet
from epochlens.features.text import extract_text_features, load_or_extract_text
from epochlens.features.text_settings import SEQ2SEQ_REPRESENTATIONS, TextFeatureSettings, text_feature_params
from epochlens.probes.linear import probe_features
from epochlens.probes.settings import ProbeSettings

transformers = pytest.importorskip("transformers")
VOCAB, PAD, EOS, L, T = 30, 0, 1, 9, 5
CKPT = "e" * 64
ENCODER = ["encoder.block.0", "encoder.block.1"]
DECODER = ["decoder.block.0", "decoder.block.1", "decoder.block.2"]


def tiny_t5() -> nn.Module:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_decoder_layers=3, num_heads=2,
        dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(2)
    return transformers.T5ForConditionalGeneration(config).eval()


def t2t_batch(rng: np.random.Generator, n: int = 6) -> dict[str, torch.Tensor]:
    """Right-padded prompts of 1..7 tokens and eos, targets of 0..3 tokens and eos (-100 padding)."""
    ids = np.full((n, L), PAD, dtype=np.int64)
    mask = np.zeros((n, L), dtype=np.int64)
    labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    for i in range(n):
        p, t = int(rng.integers(1, 8)), int(rng.integers(0, 4))
        ids[i, : p + 1] = [*rng.integers(2, VOCAB, p), EOS]
        mask[i, : p + 1] = 1
        labels[i, : t + 1] = [*rng.integers(2, VOCAB, t), EOS]
    return {
        k: torch.from_numpy(v) for k, v in (("input_ids", ids), ("attention_mask", mask), ("labels", labels))
    }


def without_final_norm(model: nn.Module, stack: str) -> nn.Module:
    """A copy of ``model`` whose ``stack`` (encoder or decoder) has no final layer norm (the other
    keeps its own: the decoder still reads the encoder's normed output)."""
    net = copy.deepcopy(model)
    getattr(net, stack).final_layer_norm = nn.Identity()
    return net


def hf_hidden_states_alone(net: nn.Module, inputs: dict, i: int, stack: str) -> list[torch.Tensor]:
    """Every block's output of the ``stack`` for sample i alone (no padding at all), from
    ``output_hidden_states``: {stack}_hidden_states[N + 1] for block N, the last without T5's final
    layer norm (the hidden states' last entry has it: ``net`` is :func:`without_final_norm`'s)."""
    real, target = inputs["attention_mask"][i].bool(), inputs["labels"][i] != IGNORE_INDEX
    with torch.no_grad():
        out = net(
            input_ids=inputs["input_ids"][i, real][None],
            labels=inputs["labels"][i, target][None],
            output_hidden_states=True,
        )
    return [h[0] for h in getattr(out, f"{stack}_hidden_states")[1:]]


def test_mean_and_first_of_every_block_equal_hidden_states_at_the_documented_positions():
    rng = np.random.default_rng(5)
    model, inputs = tiny_t5(), t2t_batch(rng)
    feats = extract_text_features(model, inputs, names=SEQ2SEQ_REPRESENTATIONS, batch_size=4)
    assert list(feats) == ENCODER + DECODER  # the decoder's blocks: the labels are given
    nets = {stack: without_final_norm(model, stack) for stack in ("encoder", "decoder")}
    for i in range(len(inputs["input_ids"])):
        encoder, decoder = (hf_hidden_states_alone(nets[s], inputs, i, s) for s in ("encoder", "decoder"))
        for layer, h in zip(ENCODER + DECODER, encoder + decoder, strict=True):
            for name, want in (("mean", h.mean(0)), ("first", h[0])):
                torch.testing.assert_close(
                    torch.as_tensor(feats[layer][name][i]),
                    want,
                    rtol=1e-5,
                    atol=1e-6,
                    msg=f"{layer} {name} {i}",
                )
    # more padding on both sides of every sample changes nothing
    padded = {k: nn.functional.pad(v, (0, 4), value=IGNORE_INDEX if k == "labels" else PAD)
              for k, v in inputs.items()}  # fmt: skip
    again = extract_text_features(model, padded, names=SEQ2SEQ_REPRESENTATIONS, batch_size=6)
    for layer in feats:
        for name in SEQ2SEQ_REPRESENTATIONS:
            np.testing.assert_allclose(again[layer][name], feats[layer][name], rtol=1e-5, atol=1e-6)
    # without the decoder labels (a T5's encoder only): the encoder's blocks, as before
    encoder_only = {k: v for k, v in inputs.items() if k != "labels"}
    assert list(extract_text_features(model.get_encoder(), encoder_only, layers=["block.0"])) == ["block.0"]


def t2t_data(rng: np.random.Generator) -> TextDataset:
    """Prompts in two groups that differ in their first token (10 or 20), targets random."""
    train, test = t2t_batch(rng, n=40), t2t_batch(rng, n=16)
    groups = {"train": np.arange(40) % 2, "test": np.arange(16) % 2}
    for split, batch in (("train", train), ("test", test)):
        batch["input_ids"][:, 0] = torch.from_numpy(np.where(groups[split] == 0, 10, 20))
    return TextDataset(
        name="tiny_t2t", source="test", kind="text_to_text",
        **{f"{s}_{k}": b[k].numpy() for s, b in (("train", train), ("test", test)) for k in b},
        tokenizer="tok sha256:0", pad_token_id=PAD, vocab_size=VOCAB, holdout=np.arange(40) >= 30,
        train_groups=groups["train"], test_groups=groups["test"], group_names=["a", "b"],
    )  # fmt: skip


def test_cache_of_a_text_to_text_model_and_probes_read_it(tmp_path):
    rng = np.random.default_rng(6)
    model, data = tiny_t5(), t2t_data(rng)
    path = tmp_path / "epoch_0030.h5"
    settings = TextFeatureSettings(names=SEQ2SEQ_REPRESENTATIONS, batch_size=7)
    fs = load_or_extract_text(path, lambda: model, data, CKPT, settings).features
    assert fs.layers == ENCODER + DECODER and fs.representations == list(SEQ2SEQ_REPRESENTATIONS)
    assert fs.shape("encoder.block.0") == (16, L) and fs.shape("decoder.block.2") == (16, T)
    want = extract_text_features(model, data.inputs("test"), names=SEQ2SEQ_REPRESENTATIONS)
    for layer in (ENCODER[1], DECODER[0]):
        for name in SEQ2SEQ_REPRESENTATIONS:
            np.testing.assert_allclose(fs.array("test", layer, name), want[layer][name], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(fs.labels("test"), data.test_labels)  # the decoder labels (N, T)
    targets = {"group": {"train": data.train_groups, "test": data.test_groups}}
    table = probe_features(FeatureSet(path), targets, data.holdout, ProbeSettings(seeds=(0,), max_epochs=30))
    assert set(table["layer"]) == set(ENCODER + DECODER)
    assert set(table["representation"]) == set(SEQ2SEQ_REPRESENTATIONS) and table["accuracy"].notna().all()
    # the groups differ in the prompt's first token: the encoder's first block tells them apart
    first = table[(table["layer"] == ENCODER[0]) & (table["representation"] == "first")]
    assert (first["accuracy"] == 1.0).all(), first
    # a causal LM's or a classifier's representations do not fit text-to-text data
    with pytest.raises(FeatureError, match=r"\['prompt_last', 'last'\] do not fit text_to_text"):
        load_or_extract_text(
            tmp_path / "x.h5",
            lambda: model,
            data,
            CKPT,
            TextFeatureSettings(names=["prompt_last", "mean", "last"]),
        )


def test_a_text_to_text_runs_params_name_its_representations():
    run = {
        "features": {"layers": None, "dtype": "float32"},
        "data": {"text": {"prompt_column": "sentence", "target_column": "answer"}},
        "model": {"hf": {"task": "text_to_text"}},
    }
    assert text_feature_params(run)["representations"] == {"names": ["mean", "first"]}
    run["model"]["hf"]["task"] = "causal_lm"
    assert text_feature_params(run)["representations"] == {"names": ["prompt_last", "target_mean"]}
