"""Head and MLP-neuron ablations of tiny transformers (BERT: Linear projections; GPT-2: Conv1D),
against exact answers: zero-ablating a head is zeroing its columns of the output projection; a
head whose output the model ignores changes nothing when ablated; means count real tokens only."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from epochlens.ablation.heads import ablated_units, head_sites, mlp_sites, site_means
from epochlens.formats.user_model import attach_output_adapter
from epochlens.models.hf import build_hf_model

VOCAB, LAYERS, HEADS, D = 14, 2, 4, 16


def tiny(model_type: str) -> torch.nn.Module:
    if model_type == "bert":
        config = {"model_type": "bert", "hidden_size": D, "num_hidden_layers": LAYERS,
                  "num_attention_heads": HEADS, "intermediate_size": 32, "max_position_embeddings": 16,
                  "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}  # fmt: skip
    else:
        config = {"model_type": "gpt2", "n_embd": D, "n_layer": LAYERS, "n_head": HEADS, "n_inner": 32,
                  "n_positions": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # fmt: skip
    model = build_hf_model(config, "sequence_classification", 3, 0, seed=1, vocab_size=VOCAB).double()
    attach_output_adapter(model, "logits")
    return model


def batch(pad: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (5, 6), generator=g)
    mask = torch.ones_like(ids)
    ids[1, 4:], mask[1, 4:] = 0, 0  # a shorter sentence (right padding)
    if pad:
        ids = torch.cat([ids, torch.zeros(5, pad, dtype=ids.dtype)], 1)
        mask = torch.cat([mask, torch.zeros(5, pad, dtype=mask.dtype)], 1)
    return {"input_ids": ids, "attention_mask": mask}


def zero_columns(model: torch.nn.Module, site: str, start: int, stop: int) -> torch.nn.Module:
    """A copy whose projection ``site`` ignores input features start..stop-1."""
    other = copy.deepcopy(model)
    module = dict(other.named_modules())[site]
    with torch.no_grad():
        if isinstance(module, torch.nn.Linear):
            module.weight[:, start:stop] = 0  # (out, in)
        else:
            module.weight[start:stop, :] = 0  # Conv1D: (in, out)
    return other


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_zero_ablating_a_head_is_zeroing_its_projection_columns(model_type):
    model, x = tiny(model_type).eval(), batch()
    units = head_sites(model)
    assert len(units) == LAYERS * HEADS and {u.stop - u.start for u in units} == {D // HEADS}
    assert [u.name for u in units[:HEADS]] == [f"head {h}" for h in range(HEADS)]
    with torch.no_grad():
        base = model(**x)
        for unit in (units[1], units[HEADS + 2]):
            with ablated_units(model, unit, "zero"):
                got = model(**x)
            want = zero_columns(model, unit.site, unit.start, unit.stop)(**x)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            assert (got - base).abs().max() > 1e-6  # the head matters


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_a_head_the_model_ignores_changes_nothing(model_type):
    trained, x = tiny(model_type).eval(), batch()
    unit = head_sites(trained)[HEADS + 1]
    model = zero_columns(trained, unit.site, unit.start, unit.stop)  # the projection ignores the head
    means = site_means(model, iter([x]), [unit.site])
    with torch.no_grad():
        base = model(**x)
        for mode in ("zero", "mean"):
            with ablated_units(model, unit, mode, means):
                torch.testing.assert_close(model(**x), base, rtol=0, atol=0)
        with ablated_units(
            model, head_sites(model)[HEADS], "mean", means | site_means(model, iter([x]), [unit.site])
        ):
            assert (model(**x) - base).abs().max() > 1e-6  # another head of the layer does matter


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_means_count_real_tokens_only_and_mlp_groups_split_the_neurons(model_type):
    model = tiny(model_type).eval()
    sites = sorted({u.site for u in head_sites(model)})
    short, padded = site_means(model, iter([batch()]), sites), site_means(model, iter([batch(pad=3)]), sites)
    for site in sites:
        torch.testing.assert_close(short[site], padded[site], rtol=1e-6, atol=1e-9)
    groups = mlp_sites(model, 3)
    assert len(groups) == LAYERS * 3 and [g.stop - g.start for g in groups[:3]] == [11, 11, 10]
    assert not any(g.site.endswith("attention.output.dense") for g in groups)
    x = batch()
    with torch.no_grad(), ablated_units(model, groups[4], "zero"):
        got = model(**x)
    torch.testing.assert_close(got, zero_columns(model, groups[4].site, groups[4].start, groups[4].stop)(**x),
                               rtol=0, atol=1e-12)  # fmt: skip


def polarity_bert():
    """A tiny polarity data set (40 training, 24 test sentences) and a 2-layer, 2-head BERT."""
    from epochlens.data import holdout_mask
    from epochlens.formats.text import TextSettings, load_polarity

    data = load_polarity(TextSettings(max_length=16), train=40, test=24)
    data.holdout = holdout_mask(data.train_labels, 4)
    config = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 16, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0}  # fmt: skip
    model = build_hf_model(
        config, "sequence_classification", 2, data.pad_token_id, seed=0, vocab_size=data.vocab_size
    )
    attach_output_adapter(model, "logits")
    return data, model


def test_the_ablation_table_of_a_text_checkpoint_per_cohort_and_group():
    from epochlens.ablation.heads import head_ablation_table
    from epochlens.ablation.settings import AblationSettings

    data, model = polarity_bert()
    ignored = head_sites(model)[3]  # layer 1, head 1: its projection columns zeroed below
    model = zero_columns(model, ignored.site, ignored.start, ignored.stop)
    settings = AblationSettings(channel_groups=2, modes=("zero", "mean"), batch_size=7)
    table = head_ablation_table(
        model, data, "test", np.array([0, 1]), np.array([1]), settings, 10, {"epoch": 3}
    )
    units = 2 * 2 + 2 * 2  # 2 layers x (2 heads + 2 neuron groups)
    cohorts = {"old", "new", "all", "data: contrast", "data: intensified", "data: negated", "data: plain"}
    assert set(table["cohort"]) == cohorts and len(table) == units * 2 * len(cohorts)
    assert (table["epoch"] == 3).all() and set(table["layer"]) == {0, 1}
    whole = table[table["cohort"] == "all"]
    assert (whole["n_samples"] == 24).all() and whole["accuracy_base"].nunique() == 1
    with torch.no_grad():  # the intact model's accuracy on the test sentences
        predicted = model.eval()(**data.inputs("test")).argmax(1).numpy()
    assert whole["accuracy_base"].iloc[0] == pytest.approx((predicted == data.test_labels).mean())
    gone = table[(table["block"] == ignored.site) & (table["group"] == ignored.name)]
    assert (
        len(gone) == 2 * len(cohorts)
        and (gone["delta_loss"] == 0).all()
        and (gone["delta_accuracy"] == 0).all()
    )
    assert (table["delta_loss"] != 0).any()


def test_bfloat16_head_ablations_are_close_to_float32():
    from epochlens.ablation.heads import head_ablation_table
    from epochlens.ablation.settings import AblationSettings

    data, model = polarity_bert()
    tables = {
        p: head_ablation_table(
            model,
            data,
            "test",
            np.array([0, 1]),
            np.array([1]),
            AblationSettings(channel_groups=2, precision=p),
        )
        for p in ("float32", "bfloat16")
    }
    np.testing.assert_allclose(tables["bfloat16"]["loss"], tables["float32"]["loss"], atol=0.03)
    assert not np.array_equal(tables["bfloat16"]["loss"], tables["float32"]["loss"])


def tiny_bart() -> torch.nn.Module:
    """A tiny BART (text_to_text) built from its config, in float64: 2 encoder heads of 8 features,
    4 decoder heads of 4 (self- and cross-attention), returning its logits."""
    config = {"model_type": "bart", "d_model": D, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
              "encoder_attention_heads": 2, "decoder_attention_heads": 4, "encoder_ffn_dim": 32,
              "decoder_ffn_dim": 24, "max_position_embeddings": 16, "dropout": 0.0, "attention_dropout": 0.0,
              "activation_dropout": 0.0, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3,
              "decoder_start_token_id": 3, "forced_eos_token_id": 3}  # fmt: skip
    model = build_hf_model(config, "text_to_text", None, 0, seed=1, vocab_size=VOCAB).double().eval()
    attach_output_adapter(model, "logits")
    return model


@pytest.mark.parametrize(
    ("site", "head", "width"),
    [
        ("model.encoder.layers.1.self_attn.out_proj", 1, 8),  # encoder self-attention
        ("model.decoder.layers.0.self_attn.out_proj", 2, 4),  # decoder self-attention
        ("model.decoder.layers.1.encoder_attn.out_proj", 3, 4),  # cross-attention
    ],
)
def test_bart_heads_of_encoder_decoder_and_cross_attention_are_their_out_proj_columns(site, head, width):
    """BART's heads (its encoder and decoder may have different numbers): ablating one by the
    pipeline's hook equals zeroing that head's input columns of ``out_proj``; the MLP groups are
    ``fc2``'s inputs."""
    from epochlens.outcome import IGNORE_INDEX, sequence_outcome

    model, x = tiny_bart(), batch()
    labels = torch.tensor([[4, 5, 3], [6, 3, IGNORE_INDEX], [7, 8, 3], [9, 3, IGNORE_INDEX], [4, 4, 3]])
    x = {**x, "labels": labels}  # BART builds its decoder inputs from them (shifted right)
    units = head_sites(model)
    names = [u.site for u in units]
    assert names.count("model.encoder.layers.0.self_attn.out_proj") == 2
    assert names.count("model.decoder.layers.1.self_attn.out_proj") == 4
    assert names.count("model.decoder.layers.0.encoder_attn.out_proj") == 4
    assert len(units) == LAYERS * (2 + 4 + 4)
    unit = next(u for u in units if u.site == site and u.name == f"head {head}")
    assert (unit.start, unit.stop) == (head * width, (head + 1) * width)
    with torch.no_grad():
        base = model(**x)
        with ablated_units(model, unit, "zero"):
            got = model(**x)
        want = zero_columns(model, site, unit.start, unit.stop)(**x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert (got - base).abs().max() > 1e-6  # the head matters: the check can fail
    loss_got, loss_want = (sequence_outcome(z, labels, shift=False)[1] for z in (got, want))
    torch.testing.assert_close(loss_got, loss_want, rtol=1e-12, atol=0)
    mlp = mlp_sites(model, 2)
    assert {u.site for u in mlp} == {f"model.{side}.layers.{k}.fc2" for side in ("encoder", "decoder")
                                     for k in range(LAYERS)}  # fmt: skip
    widths = {side: max(u.stop for u in mlp if side in u.site) for side in ("encoder", "decoder")}
    assert widths == {"encoder": 32, "decoder": 24}  # each side's ffn width


def test_a_text_checkpoints_heads_in_parts_make_the_whole_table():
    import pandas as pd

    from epochlens.ablation.heads import head_ablation_table
    from epochlens.ablation.settings import AblationSettings

    data, model = polarity_bert()
    args = (model, data, "test", np.array([0, 1]), np.array([1]))

    def table(**part):
        return head_ablation_table(*args, AblationSettings(channel_groups=2, batch_size=7, **part), 10)

    parts = [table(part=k, parts=3) for k in range(3)]
    pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), table(), check_exact=True)
    units = [len(p[["block", "group"]].drop_duplicates()) for p in parts]
    assert units == [2, 3, 3]  # 8 units (4 heads, then 4 MLP neuron groups) in contiguous blocks
