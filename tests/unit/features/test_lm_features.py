"""Features of a language model's sequences (a prompt, then its target tokens) against Hugging
Face's own ``output_hidden_states``, on tiny float64 causal LMs built from configs (GPT-2, and a
Llama with grouped-query attention): ``prompt_last`` is the hidden state at the last prompt token,
``target_mean`` the mean over the target tokens' positions; padding changes nothing; the cache
writes them in the image features' file, and probes read it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from epochlens.data.text import IGNORE_INDEX, TextDataset
from epochlens.errors import FeatureError
from epochlens.features.cache import FeatureSet
from epochlens.features.text import extract_text_features, load_or_extract_text, text_representations
from epochlens.features.text_settings import LM_REPRESENTATIONS, TextFeatureSettings, text_feature_params
from epochlens.probes.linear import probe_features
from epochlens.probes.settings import ProbeSettings

transformers = pytest.importorskip("transformers")
VOCAB, PAD, T = 30, 0, 10
CKPT = "d" * 64


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32, pad_token_id=PAD,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.GPT2LMHeadModel(config).double().eval()


def tiny_llama_gqa() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(config).double().eval()


MODELS = {"gpt2": tiny_gpt2, "llama_gqa": tiny_llama_gqa}


def lm_batch(rng: np.random.Generator, n: int = 6, length: int = T) -> dict[str, torch.Tensor]:
    """Right-padded prompts of 1..4 tokens followed by 1..3 target tokens (labels -100 elsewhere)."""
    ids = np.full((n, length), PAD, dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.int64)
    labels = np.full((n, length), IGNORE_INDEX, dtype=np.int64)
    for i in range(n):
        p, t = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        ids[i, : p + t] = rng.integers(2, VOCAB, p + t)
        mask[i, : p + t] = 1
        labels[i, p : p + t] = ids[i, p : p + t]
    return {
        k: torch.from_numpy(v) for k, v in (("input_ids", ids), ("attention_mask", mask), ("labels", labels))
    }


def hf_block_outputs(model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """Every block's output from ``output_hidden_states``: hidden_states[N + 1] for block N, the
    last without the final norm (hidden_states[-1] has it: the norm is set to the identity)."""
    norm = "ln_f" if hasattr(model, "transformer") else "norm"
    base = model.transformer if hasattr(model, "transformer") else model.model
    setattr(base, norm, nn.Identity())
    with torch.no_grad():
        out = model(**{k: inputs[k] for k in ("input_ids", "attention_mask")}, output_hidden_states=True)
    return list(out.hidden_states[1:])


@pytest.mark.parametrize("family", sorted(MODELS))
def test_prompt_last_and_target_mean_equal_hidden_states_at_the_documented_positions(family):
    rng = np.random.default_rng(3)
    model, inputs = MODELS[family](), lm_batch(rng)
    feats = extract_text_features(model, inputs, names=LM_REPRESENTATIONS, batch_size=4)
    hidden = hf_block_outputs(model, inputs)
    assert len(feats) == 2 == len(hidden)
    labels = inputs["labels"].numpy()
    for layer, h in zip(feats, hidden, strict=True):
        for i in range(len(labels)):
            targets = np.flatnonzero(labels[i] != IGNORE_INDEX)
            torch.testing.assert_close(
                torch.as_tensor(feats[layer]["prompt_last"][i]), h[i, targets[0] - 1], rtol=1e-10, atol=1e-12
            )
            torch.testing.assert_close(
                torch.as_tensor(feats[layer]["target_mean"][i]), h[i, targets].mean(0), rtol=1e-10, atol=1e-12
            )
    # padding appended to every sequence changes nothing
    padded = {k: torch.nn.functional.pad(v, (0, 3), value=IGNORE_INDEX if k == "labels" else 0)
              for k, v in inputs.items()}  # fmt: skip
    again = extract_text_features(model, padded, names=LM_REPRESENTATIONS)
    for layer in feats:
        for name in LM_REPRESENTATIONS:
            np.testing.assert_allclose(again[layer][name], feats[layer][name], rtol=1e-9, atol=1e-12)


def test_a_sequence_without_target_or_prompt_is_named():
    hidden = torch.zeros(2, 3, 4)
    mask = torch.ones(2, 3, dtype=torch.long)
    no_target = torch.tensor([[-100, 5, 6], [-100, -100, -100]])
    with pytest.raises(FeatureError, match=r"sequences \[1\] .* no target token"):
        text_representations(hidden, mask, ["target_mean"], no_target)
    no_prompt = torch.tensor([[-100, 5, 6], [7, 8, -100]])
    with pytest.raises(FeatureError, match=r"sequences \[1\] .* no prompt token"):
        text_representations(hidden, mask, ["prompt_last"], no_prompt)
    with pytest.raises(FeatureError, match="token labels"):
        text_representations(hidden, mask, ["prompt_last"])


def lm_data(rng: np.random.Generator) -> TextDataset:
    train, test = lm_batch(rng, n=24), lm_batch(rng, n=8)
    groups = {"train": np.arange(24) % 2, "test": np.arange(8) % 2}
    return TextDataset(
        name="tiny_lm", source="test", kind="causal_lm",
        **{f"{s}_{k}": b[k].numpy() for s, b in (("train", train), ("test", test)) for k in b},
        tokenizer="tok sha256:0", pad_token_id=PAD, vocab_size=VOCAB, holdout=np.arange(24) >= 18,
        train_groups=groups["train"], test_groups=groups["test"], group_names=["a", "b"],
    )  # fmt: skip


def test_cache_of_a_language_model_and_probes_read_it(tmp_path):
    rng = np.random.default_rng(4)
    model, data = tiny_gpt2().float(), lm_data(rng)
    path = tmp_path / "epoch_0100.h5"
    settings = TextFeatureSettings(names=LM_REPRESENTATIONS, batch_size=5)
    fs = load_or_extract_text(path, lambda: model, data, CKPT, settings).features
    assert fs.representations == list(LM_REPRESENTATIONS)
    assert fs.layers == ["transformer.h.0", "transformer.h.1"]
    want = extract_text_features(model, {**data.inputs("test"), "labels": torch.as_tensor(data.test_labels)},
                                 names=LM_REPRESENTATIONS)  # fmt: skip
    for name in LM_REPRESENTATIONS:
        np.testing.assert_allclose(
            fs.array("test", "transformer.h.1", name), want["transformer.h.1"][name], rtol=0, atol=1e-6
        )
    targets = {"group": {"train": data.train_groups, "test": data.test_groups}}
    table = probe_features(FeatureSet(path), targets, data.holdout, ProbeSettings(seeds=(0,), max_epochs=2))
    assert set(table["representation"]) == set(LM_REPRESENTATIONS) and table["accuracy"].notna().all()
    # a sequence classifier's representations do not fit a language model's data, and the reverse
    with pytest.raises(FeatureError, match=r"\['mean', 'last'\] do not fit causal_lm"):
        load_or_extract_text(tmp_path / "x.h5", lambda: model, data, CKPT, TextFeatureSettings())


def test_a_language_model_runs_params_name_its_representations():
    run = {"features": {"layers": None, "dtype": "float32"}, "data": {"text": {"target_column": "target"}}}
    assert text_feature_params(run)["representations"] == {"names": ["prompt_last", "target_mean"]}
    run["data"]["text"] = {"label_column": "label"}
    assert text_feature_params(run)["representations"] == {"names": ["mean", "last"]}
