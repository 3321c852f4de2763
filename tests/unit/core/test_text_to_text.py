"""Text-to-text (encoder-decoder) runs on a tiny float64 T5 with a word-level tokenizer: prompts
become encoder inputs and targets decoder labels ending with eos (-100 padding); the evaluation's
loss is transformers' own loss of each sample alone and exact match is greedy decoding's; the
curvature's loss is that loss, its exact mode equals h·H v with H the explicit Hessian in the space
of the encoder's real-token embeddings; ablating an encoder, a decoder and a cross-attention head
equals zeroing that head's input columns of the output projection ``o``."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from quality import SEED, at_least, below

from epochlens.data.text import IGNORE_INDEX
from epochlens.formats.text import TextSettings, text_dataset
from epochlens.formats.user_model import attach_output_adapter
from epochlens.models.hf import build_hf_model, tiny_config

WORDS = ["<pad>", "<unk>", "</s>", "good", "bad", "film", "plot", "not", "very", "positive", "negative"]
EOS = 2


def write_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="</s>"
    )
    tok.save_pretrained(str(folder))
    return folder


TABLES = {
    "train": pd.DataFrame(
        {
            "prompt": ["good film", "bad plot", "very good film", "not good", "bad bad film plot"],
            "target": ["positive", "negative", "very positive", "negative", "negative"],
            "group": ["a", "b", "a", "b", "a"],
        }
    ),
    "test": pd.DataFrame(
        {"prompt": ["good", "not bad film"], "target": ["positive", "positive"], "group": ["a", "b"]}
    ),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")
    settings = TextSettings(
        prompt_column="prompt", target_column="target", group_column="group", encoder_decoder=True
    )
    return text_dataset(TABLES, None, settings, folder, "t2t", "test")


@pytest.fixture(scope="module")
def models(data):
    """(transformers' T5ForConditionalGeneration in float64, the same returning its logits)."""
    config = tiny_config("t5", len(WORDS), pad_token_id=0, eos_token_id=EOS, hidden=8, heads=2, mlp_width=16)
    raw = build_hf_model(config.to_dict(), "text_to_text", seed=3).double().eval()
    adapted = copy.deepcopy(raw)
    attach_output_adapter(adapted, "logits")
    return raw, adapted


def own_loss(raw, data, split: str, k: int) -> tuple[float, bool]:
    """transformers' loss of sample k alone (unpadded) and whether greedy decoding gives its target."""
    ids = data.inputs(split)["input_ids"][k]
    ids = ids[data.inputs(split)["attention_mask"][k].bool()][None]
    labels = data.labels(split)[k]
    labels = torch.tensor(labels[labels != IGNORE_INDEX])[None]
    with torch.no_grad():
        out = raw(input_ids=ids, labels=labels)
        greedy = raw.generate(input_ids=ids, max_new_tokens=labels.shape[1], do_sample=False)
    same = greedy.shape[1] == labels.shape[1] + 1 and (greedy[0, 1:] == labels[0]).all()
    return float(out.loss), bool(same)


def test_prompts_are_encoder_inputs_and_targets_decoder_labels_ending_with_eos(data):
    assert data.kind == "text_to_text" and data.token_labels
    ids = {w: i for i, w in enumerate(WORDS)}
    # "very positive" + eos, padded with -100 to the longest target (3 tokens)
    np.testing.assert_array_equal(data.train_labels[2], [ids["very"], ids["positive"], EOS])
    np.testing.assert_array_equal(data.train_labels[0], [ids["positive"], EOS, IGNORE_INDEX])
    np.testing.assert_array_equal(data.train_input_ids[4], [ids[w] for w in "bad bad film plot".split()])
    assert data.train_input_ids.shape == (5, 4) and data.test_labels.shape == (2, 3)
    inputs = data.inputs("test", np.array([1]))
    assert set(inputs) == {"input_ids", "attention_mask", "labels"}
    np.testing.assert_array_equal(inputs["labels"][0], [ids["positive"], EOS, IGNORE_INDEX])
    from epochlens.data import holdout_mask

    # token labels have one class: the holdout is the first k samples (not k per token id)
    np.testing.assert_array_equal(holdout_mask(data.train_labels, 2), [True, True, False, False, False])


def test_a_text_to_text_model_needs_its_columns_and_text_to_text_needs_an_encoder_decoder(tmp_path):
    from epochlens.errors import ConfigError
    from epochlens.models.hf_heads import task_problem

    with pytest.raises(ConfigError, match="text_to_text.*prompt_column and target_column"):
        TextSettings(encoder_decoder=True)
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    t5 = tmp_path / "t5.json"
    t5.write_text('{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}')
    t5_classifier = tmp_path / "t5c.json"
    t5_classifier.write_text('{"model_type": "t5", "architectures": ["T5ForSequenceClassification"]}')
    assert task_problem(t5, "text_to_text") is None
    assert "set model.hf.task: text_to_text" in task_problem(t5, "causal_lm")
    assert "not an encoder-decoder model" in task_problem(gpt2, "text_to_text")
    assert "set model.hf.task: causal_lm" in task_problem(gpt2, "text_to_text")
    assert task_problem(t5_classifier, "sequence_classification") is None  # a T5 classifier is one


def test_evaluation_loss_is_transformers_loss_of_each_sample_and_exact_match_greedy(data, models):
    from epochlens.evaluation import evaluate_checkpoint, predict

    raw, adapted = models
    for split in ("train", "test"):
        n = len(data.labels(split))
        correct, loss = predict(adapted, data.inputs(split), data.labels(split), np.zeros(1, np.int64), 2)
        expected = [own_loss(raw, data, split, k) for k in range(n)]
        np.testing.assert_allclose(loss, [e[0] for e in expected], rtol=1e-6)  # float32 table
        np.testing.assert_array_equal(correct, [e[1] for e in expected])
    table = evaluate_checkpoint(adapted, data, None, 7)
    test = table[table["split"] == "test"].set_index("data_group")
    np.testing.assert_allclose(test.loc["b", "mean_loss"], own_loss(raw, data, "test", 1)[0], rtol=1e-6)
    assert (table["class_id"] == 0).all() and set(table["split"]) == {"test"}  # no holdout here


def test_a_model_that_writes_the_targets_is_exactly_right():
    """Exact match is every target token the top choice: logits made to pick the labels are right,
    one wrong token is not (teacher forcing, no shift)."""
    from epochlens.outcome import sequence_outcome

    labels = torch.tensor([[4, 2, IGNORE_INDEX], [5, 6, 2]])
    logits = torch.nn.functional.one_hot(labels.clamp_min(0), 8).double() * 5
    hit, loss = sequence_outcome(logits, labels, shift=False)
    assert hit.tolist() == [True, True]
    logits[1, 1] = torch.nn.functional.one_hot(torch.tensor(3), 8) * 5
    hit, loss2 = sequence_outcome(logits, labels, shift=False)
    assert hit.tolist() == [True, False] and loss2[1] > loss[1]
    nll = -torch.log_softmax(logits[0, :2], 1)[[0, 1], [4, 2]]
    np.testing.assert_allclose(loss[0], nll.mean(), rtol=1e-12)


def test_curvature_of_the_encoder_embeddings_is_the_explicit_hessian(data, models):
    from epochlens.curvature.estimator import per_sample_curvature, token_directions
    from epochlens.curvature.settings import CurvatureSettings

    raw, adapted = models
    tokens = data.inputs("train")
    with torch.no_grad():
        embeds = adapted.get_encoder().get_input_embeddings()(tokens["input_ids"]).double()
    indices = np.arange(5) + 20
    settings = CurvatureSettings(n_directions=3, h=1e-4, seed=2, mode="exact")
    got = per_sample_curvature(
        adapted, embeds, data.train_labels, indices, np.array([0]), settings, "cpu", tokens=tokens
    )
    np.testing.assert_allclose(got["loss"], [own_loss(raw, data, "train", k)[0] for k in range(5)], rtol=1e-6)
    k = 4  # the longest prompt: 4 real encoder tokens
    real = tokens["attention_mask"][k].bool()
    labels = torch.tensor(data.train_labels[k : k + 1])

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        full = embeds[k : k + 1].clone()
        full[0, real] = x.view(int(real.sum()), -1)
        return raw(inputs_embeds=full, attention_mask=tokens["attention_mask"][k : k + 1], labels=labels).loss

    x0 = embeds[k, real].flatten()
    hessian = torch.autograd.functional.hessian(loss_of, x0)
    v = token_directions(2, indices[k : k + 1], tokens["attention_mask"][k : k + 1], 8, 3, torch.float64)[0]
    v = v[:, real].reshape(3, -1)
    hv = v @ hessian  # H is symmetric
    expected_curv = (settings.h * hv).norm(dim=1).mean()
    expected_eig = (settings.h**2 * (v * hv).sum(1)).mean()
    np.testing.assert_allclose(got["curvature"][k], expected_curv, rtol=1e-5)
    np.testing.assert_allclose(got["directional_eig"][k], expected_eig, rtol=1e-5, atol=1e-12)
    grad = torch.autograd.functional.jacobian(loss_of, x0)
    np.testing.assert_allclose(got["grad_norm"][k], grad.norm(), rtol=1e-5)


def zero_columns(model: torch.nn.Module, site: str, start: int, stop: int) -> torch.nn.Module:
    out = copy.deepcopy(model)
    with torch.no_grad():
        dict(out.named_modules())[site].weight[:, start:stop] = 0
    return out


def test_ablating_encoder_decoder_and_cross_attention_heads_is_zeroing_their_o_columns(data, models):
    from epochlens.ablation.ablate import per_sample_outcome
    from epochlens.ablation.heads import head_ablation_table, head_sites, site_means
    from epochlens.ablation.settings import AblationSettings

    _, adapted = models
    units = head_sites(adapted)
    sites = [u.site for u in units]
    for part in ("encoder.block.1.layer.0.SelfAttention.o", "decoder.block.0.layer.0.SelfAttention.o",
                 "decoder.block.1.layer.1.EncDecAttention.o"):  # fmt: skip
        assert sites.count(part) == 2, part  # two heads each
    settings = AblationSettings(modes=("zero", "mean"), channel_groups=2, batch_size=2)
    table = head_ablation_table(adapted, data, "test", None, None, settings)
    inputs, labels = data.inputs("test"), data.test_labels
    _, base = per_sample_outcome(adapted, inputs, labels, np.zeros(1), 2, torch.device("cpu"))
    heads = (
        ("encoder.block.1.layer.0.SelfAttention.o", 1),
        ("decoder.block.0.layer.0.SelfAttention.o", 0),
        ("decoder.block.1.layer.1.EncDecAttention.o", 1),
    )
    for site, head in heads:
        zeroed = zero_columns(adapted, site, 4 * head, 4 * (head + 1))
        _, loss = per_sample_outcome(zeroed, inputs, labels, np.zeros(1), 2, torch.device("cpu"))
        row = table[(table["block"] == site) & (table["group"] == f"head {head}") & (table["mode"] == "zero")]
        row = row.set_index("cohort")
        np.testing.assert_allclose(row.loc["all", "delta_loss"], (loss - base).mean(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(row.loc["data: b", "delta_loss"], (loss - base)[1], rtol=1e-9, atol=1e-12)
        assert abs(loss - base).max() > 1e-6  # the head matters, so the check can fail
    assert set(table["cohort"]) == {"all", "data: a", "data: b"}
    assert table["block"].str.endswith("DenseReluDense.wo").any()  # MLP neuron groups too
    # decoder sites average over real decoder positions: a mean made from them alone agrees
    batch = {k: v for k, v in inputs.items()}
    means = site_means(adapted, iter([batch]), ["decoder.block.0.layer.0.SelfAttention.o"])
    seen = []
    module = dict(adapted.named_modules())["decoder.block.0.layer.0.SelfAttention.o"]
    handle = module.register_forward_pre_hook(lambda m, i: seen.append(i[0].detach()))
    with torch.no_grad():
        adapted(**batch)
    handle.remove()
    real = torch.as_tensor(labels) != IGNORE_INDEX
    np.testing.assert_allclose(
        means["decoder.block.0.layer.0.SelfAttention.o"], seen[0][real].mean(0).float(), rtol=1e-5
    )


def t5_run(tmp_path: Path, task: str, **sections) -> dict:
    """A text-to-text run over two Trainer folders whose config.json names a T5."""
    import json

    for step in (10, 20):
        folder = tmp_path / "runs" / f"checkpoint-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(
            json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
        )
    text = {"tokenizer": str(tmp_path / "tok"), "prompt_column": "sentence", "target_column": "answer"}
    return {
        "data": {"source": "jsonl", "path": str(tmp_path / "data"), "text": text},
        "model": {"hf": {"task": task}},
        "schedule": "none",
        "checkpoints": {"source": "folder", "path": str(tmp_path / "runs" / "checkpoint-{epoch}")},
        **{stage: {"enabled": False} for stage in ("features", "probes", "influence")},
        **sections,
    }


SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


def test_the_config_check_takes_a_t5_run_and_names_what_does_not_fit(tmp_path):
    from epochlens import config as run_config
    from epochlens.errors import ConfigError
    from epochlens.features.text_settings import text_feature_params

    cfg = {"runs": {"t5": t5_run(tmp_path, "text_to_text")}}
    run_config.validate(cfg, SCHEMA)  # curvature and ablation on (the defaults): fine
    assert run_config.class_schedule(cfg["runs"]["t5"]) is None  # no classes
    # features and probes of the prompt groups; a classifier's probe targets are refused, naming the fix
    on = {"features": {"enabled": True}, "probes": {"enabled": True}}
    cfg = {"runs": {"t5": t5_run(tmp_path, "text_to_text", **on)}}
    run_config.validate(cfg, SCHEMA)
    assert text_feature_params(cfg["runs"]["t5"])["representations"] == {"names": ["mean", "first"]}
    for targets in (["class", "group"], ["cohort"], ["target_quantile"]):
        probes = {"enabled": True, "targets": targets}
        with pytest.raises(
            ConfigError, match=r"the run is a text-to-text model; .* Set probes.targets: \["
        ) as err:
            run_config.validate(
                {"runs": {"t5": t5_run(tmp_path, "text_to_text", **{**on, "probes": probes})}}, SCHEMA
            )
        assert str([t for t in targets if t != "group"]) in str(err.value)
    with pytest.raises(ConfigError, match="probes need the features"):
        run_config.validate(
            {"runs": {"t5": t5_run(tmp_path, "text_to_text", probes={"enabled": True})}}, SCHEMA
        )
    # influence: with the text_to_text task (the target tokens' mean NLL, no shift) and test prompts
    influence = {"enabled": True, "queries": {"select": "all"}}
    for task in ("classification", "language_model"):
        with pytest.raises(ConfigError, match=r"remove runs.t5.task \(it follows model.hf.task\) or set it"):
            run = {**t5_run(tmp_path, "text_to_text", influence=influence), "task": task}
            run_config.validate({"runs": {"t5": run}}, SCHEMA)
    run = {**t5_run(tmp_path, "text_to_text", influence=influence), "task": "text_to_text"}
    run_config.validate({"runs": {"t5": run}}, SCHEMA)
    # queries.select defaults to all for a run without class predictions; misclassified is refused
    run = {**t5_run(tmp_path, "text_to_text", influence={"enabled": True}), "task": "text_to_text"}
    run_config.validate({"runs": {"t5": run}}, SCHEMA)
    with pytest.raises(ConfigError, match="select: misclassified"):
        influence = {"enabled": True, "queries": {"select": "misclassified"}}
        run = {**t5_run(tmp_path, "text_to_text", influence=influence), "task": "text_to_text"}
        run_config.validate({"runs": {"t5": run}}, SCHEMA)
    with pytest.raises(ConfigError, match="set model.hf.task: text_to_text"):
        run_config.validate({"runs": {"t5": t5_run(tmp_path, "causal_lm")}}, SCHEMA)
    no_target = t5_run(tmp_path, "text_to_text")
    del no_target["data"]["text"]["target_column"], no_target["data"]["text"]["prompt_column"]
    no_target["data"]["text"]["text_column"] = "sentence"
    with pytest.raises(ConfigError, match="causal_lm or text_to_text together with data.text.prompt_column"):
        run_config.validate({"runs": {"t5": no_target}}, SCHEMA)


T5_CONFIG = {"model_type": "t5", "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2,
             "dropout_rate": 0.0, "pad_token_id": 0, "eos_token_id": EOS,
             "decoder_start_token_id": 0}  # fmt: skip


@pytest.mark.quality
def test_the_pipeline_trains_a_text_to_text_model_from_its_config(data, tmp_path):
    """train_incremental on decoder labels: the target tokens' loss falls, the model ends up writing
    the training targets, and its .pt checkpoints load back (the job's way) to the same losses."""
    from epochlens.evaluation import predict
    from epochlens.job import CheckpointJob
    from epochlens.models.build import build_untrained
    from epochlens.schedule import ClassSchedule
    from epochlens.training import TrainSettings, train_incremental

    model_section = {"hf": {"task": "text_to_text", "config": T5_CONFIG, "attention": "eager"}}
    model = build_untrained(model_section, data, seed=SEED)
    schedule = ClassSchedule(np.array([0]), 1, 0, 40)
    settings = TrainSettings(
        batch_size=4, lr=0.02, optimizer="adamw", weight_decay=0.0, early_stopping=False, seed=SEED
    )
    log = train_incremental(
        model,
        data,
        schedule,
        settings,
        lambda e: tmp_path / f"epoch_{e:04d}.pt",
        save_every=20,
        progress=False,
    )
    below("final / first epoch's training loss", log["train_loss"].iloc[-1] / log["train_loss"].iloc[0], 0.45)
    assert log["train_accuracy"].iloc[-1] > log["train_accuracy"].iloc[0]  # exact match, as it trained
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"epoch_{e:04d}.pt" for e in (0, 20, 40)]
    job = CheckpointJob(data, 40, model_section, tmp_path / "epoch_0040.pt", torch.device("cpu"))
    correct, loss = predict(job.model, data.inputs("train"), data.train_labels, np.zeros(1, np.int64))
    _, trained = predict(model, data.inputs("train"), data.train_labels, np.zeros(1, np.int64))
    at_least("training targets written exactly (of 5; untrained: none)", correct.sum(), 1)
    start = CheckpointJob(data, 0, model_section, tmp_path / "epoch_0000.pt", torch.device("cpu"))
    assert not predict(start.model, data.inputs("train"), data.train_labels, np.zeros(1, np.int64))[0].any()
    np.testing.assert_allclose(loss, trained, rtol=1e-6)


def test_a_text_to_text_run_the_pipeline_trains_has_a_one_class_schedule(tmp_path):
    from epochlens import config as run_config
    from epochlens.errors import ConfigError

    def trained(schedule) -> dict:
        run = t5_run(tmp_path, "text_to_text")
        run["model"]["hf"]["config"] = dict(T5_CONFIG)
        run.update(schedule=schedule, checkpoints={"source": "train", "save_every": 5})
        return {"runs": {"t5": run}}

    cfg = trained({"initial_classes": 1, "increment": 0, "epochs_per_task": 10})
    run_config.validate(cfg, SCHEMA)
    assert run_config.checkpoint_epochs(cfg["runs"]["t5"]) == [0, 5, 10]
    assert run_config.class_schedule(cfg["runs"]["t5"])["epochs_per_task"] == 10
    with pytest.raises(ConfigError, match=r"schedule: \{initial_classes: 1, increment: 0"):
        run_config.validate(trained({"initial_classes": 1, "increment": 1, "epochs_per_task": 10}), SCHEMA)
    without_config = trained({"initial_classes": 1, "increment": 0, "epochs_per_task": 10})
    del without_config["runs"]["t5"]["model"]["hf"]["config"]
    with pytest.raises(ConfigError, match="model.hf.config"):
        run_config.validate(without_config, SCHEMA)
