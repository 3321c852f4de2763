"""The torch-free catalog of transformer module names equals the real Hugging Face models'."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from epochlens.errors import ConfigError
from epochlens.models.hf import TINY_FAMILIES, load_hf_model, tiny_config, write_tiny_model
from epochlens.models.hf_catalog import FAMILIES, layout_from_config, layout_of

CASES = [(mt, task) for mt, tasks in TINY_FAMILIES.items() for task in tasks]


def _tiny(tmp_path, model_type, task, **kw):
    cfg = tiny_config(model_type, vocab_size=40, num_labels=3, eos_token_id=2, **kw)
    folder = write_tiny_model(tmp_path / f"{model_type}-{task}", cfg, task)
    return folder, load_hf_model(folder, task, num_labels=3)


@pytest.mark.parametrize(("model_type", "task"), CASES)
def test_catalog_names_are_the_models_modules(tmp_path, model_type, task):
    folder, model = _tiny(tmp_path, model_type, task)
    from_json = layout_from_config(folder)  # config.json only: no torch needed
    assert from_json == layout_of(model)
    modules = dict(model.named_modules())
    assert set(from_json.all_names()) <= set(modules)
    n_stacks = 2 if model_type == "t5" else 1
    assert from_json.num_layers == 2 * n_stacks
    assert from_json.head == FAMILIES[model_type].heads[task]
    # The heads tile the attention output projection's input; the MLP neurons its down projection's.
    for proj, mlp_out in zip(from_json.attention_outputs, from_json.mlp_outputs, strict=True):
        for name, width in ((proj, from_json.num_heads * from_json.head_dim), (mlp_out, from_json.mlp_width)):
            module = modules[name]
            weight = module.weight
            in_features = weight.shape[0] if from_json.projection == "conv1d" else weight.shape[1]
            assert in_features == width, name
    assert from_json.head_slice(1) == (from_json.head_dim, 2 * from_json.head_dim)
    assert isinstance(modules[from_json.embeddings], torch.nn.Embedding)
    assert modules[from_json.embeddings] is model.get_input_embeddings()


def test_head_ablation_through_the_projection_input(tmp_path):
    """Zeroing head h's slice of c_proj's input equals removing head h by hand (GPT-2 eager attention)."""
    folder, model = _tiny(tmp_path, "gpt2", "causal_lm")
    layout = layout_of(model)
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    attn = model.transformer.h[0].attn
    captured = {}
    handle = attn.c_proj.register_forward_pre_hook(lambda m, a: captured.setdefault("x", a[0].clone()))
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    start, stop = layout.head_slice(1)
    x = captured["x"]
    # c_proj is affine: output(x with head 1 zeroed) = output(x) - head 1's slice times its weight rows.
    zeroed = x.clone()
    zeroed[..., start:stop] = 0
    expected = attn.c_proj(x) - x[..., start:stop] @ attn.c_proj.weight[start:stop]
    torch.testing.assert_close(attn.c_proj(zeroed), expected)


def test_bare_and_seq2seq_architectures(tmp_path):
    cfg = json.loads(tiny_config("gpt2", vocab_size=40).to_json_string())
    bare = layout_from_config(cfg, architecture="GPT2Model")
    assert bare.prefix == "" and bare.blocks == ["h.0", "h.1"] and bare.head is None
    t5 = json.loads(tiny_config("t5", vocab_size=40, eos_token_id=1).to_json_string())
    gen = layout_from_config(t5, architecture="T5ForConditionalGeneration")
    assert gen.blocks[0] == "encoder.block.0" and gen.blocks[-1] == "decoder.block.1"
    assert gen.mlp_outputs[-1] == "decoder.block.1.layer.2.DenseReluDense.wo"
    assert gen.head == "lm_head"
    enc = layout_from_config(t5, architecture="T5EncoderModel")
    assert enc.stacks == ["encoder", "encoder"] and enc.head is None
    # A config without architectures (built by from_config for a task) assumes a head model.
    head_model = layout_from_config(cfg, head_kind="causal_lm")
    assert head_model.blocks == ["transformer.h.0", "transformer.h.1"] and head_model.head == "lm_head"


def test_unsupported_and_incomplete_configs(tmp_path):
    with pytest.raises(ConfigError, match="not in epochlens' catalog.*gpt2"):
        layout_from_config({"model_type": "my_mamba"})
    with pytest.raises(ConfigError, match="no model_type"):
        layout_from_config({"hidden_size": 3})
    with pytest.raises(ConfigError, match="number of attention heads"):
        layout_from_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 8})
    with pytest.raises(ConfigError, match="no config.json"):
        layout_from_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable config.json"):
        layout_from_config(tmp_path)


def test_catalog_imports_no_torch():
    code = "import sys, epochlens.models.hf_catalog; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
