"""A text-to-text (encoder-decoder) model the user trained with the Hugging Face Trainer, through
the pipeline: config/examples/text_to_text.yaml with its paths pointed at a project made here in
the real formats: polarity sentences and their label words ("positive" / "negative") in four groups
in train.jsonl / test.jsonl, a word-level tokenizer saved with save_pretrained, and a tiny T5
(built from a T5Config) trained by transformers' Seq2SeqTrainer to write the label word, which
wrote ``checkpoint-{step}/`` folders.

What epochlens reports must be what the user's model does: the evaluation's mean loss per group is
the mean of transformers' own loss of each test sample alone (labels = its target tokens and eos),
exact match is every target token the model's top choice; zeroing an encoder self-attention, a
decoder self-attention and a cross-attention head equals the model with that head's input columns
of the output projection ``o`` set to zero; every training sample has its curvature at every
checkpoint, whose loss is transformers' own loss of that sample alone; the features of every
encoder and decoder block are transformers' own hidden states (``output_hidden_states``) at the
documented positions, and probes of the sentence groups give a finite accuracy per block. The
example's second run, a T5 the pipeline trains from its config, has its evaluation checked the same
way and its LDS (a few retrainings on halves of the data) a finite correlation for each influence
method.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from dossier_checks import check_detectors, check_influence, check_training_rows
from dossier_checks import read as read_dossier
from quality import SEED, above, below
from wfutil import REPO, copy_workflow, snakemake, write_config

from epochlens.layout import Layout

pytestmark = [pytest.mark.slow, pytest.mark.workflow]

STEPS = (15, 30)  # the Trainer's checkpoints: every 15 steps of 30
HIDDEN, HEADS = 32, 2
D_HEAD = HIDDEN // HEADS
LDS_SUBSETS = 4  # the pipeline-trained T5's LDS retrainings


#: The user's own poisoning before training: these training answers flipped, marked in a column.
FLIPPED = np.array([3, 11, 20, 37, 45, 58])


def tables() -> dict[str, pd.DataFrame]:
    """Polarity sentences (epochlens' generator) with their label word as the target."""
    from epochlens.data.polarity import polarity_tables

    frames = {
        split: pd.DataFrame({"sentence": df["text"], "answer": df["label"], "group": df["group"]})
        for split, df in polarity_tables(64, 24, seed=4 + SEED).items()
    }
    train = frames["train"]
    train["poisoned"] = np.isin(np.arange(len(train)), FLIPPED)
    train.loc[train["poisoned"], "answer"] = train.loc[train["poisoned"], "answer"].map(
        {"negative": "positive", "positive": "negative"}
    )
    return frames


def write_tokenizer(folder: Path) -> Path:
    """A T5-like word-level tokenizer: <pad> 0, </s> 1, <unk> 2, and </s> after every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from epochlens.data.polarity import SPECIAL_TOKENS, TRIGGER_WORDS, vocabulary

    # the words of the sentences (not the trigger words, which none of them uses)
    skip = {*SPECIAL_TOKENS, *TRIGGER_WORDS}
    words = ["<pad>", "</s>", "<unk>", *[w for w in vocabulary() if w not in skip]]
    words += [w for w in ("positive", "negative") if w not in words]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="</s>"
    )
    tokenizer.save_pretrained(str(folder))
    return folder


def write_project(root: Path) -> dict:
    """The user's data, tokenizer and Seq2SeqTrainer run under ``root``."""
    from transformers import (
        AutoTokenizer,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        T5Config,
        T5ForConditionalGeneration,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    data = root / "data" / "polarity_t5"
    data.mkdir(parents=True)
    frames = tables()
    for split, df in frames.items():
        df.to_json(data / f"{split}.jsonl", orient="records", lines=True)
    tokenizer_dir = write_tokenizer(root / "runs" / "polarity_t5" / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)

    def encode(df: pd.DataFrame) -> list[dict]:
        return [  # the tokenizer ends both with </s>, as T5's does
            {"input_ids": tokenizer(s)["input_ids"], "labels": tokenizer(text_target=a)["input_ids"]}
            for s, a in zip(df["sentence"], df["answer"], strict=True)
        ]

    def collate(rows: list[dict]) -> dict:
        n, t = max(len(r["input_ids"]) for r in rows), max(len(r["labels"]) for r in rows)
        out = {
            "input_ids": torch.zeros(len(rows), n, dtype=torch.long),
            "attention_mask": torch.zeros(len(rows), n, dtype=torch.long),
            "labels": torch.full((len(rows), t), -100),
        }
        for i, r in enumerate(rows):
            out["input_ids"][i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            out["attention_mask"][i, : len(r["input_ids"])] = 1
            out["labels"][i, : len(r["labels"])] = torch.tensor(r["labels"])
        return out

    torch.manual_seed(SEED)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = T5Config(vocab_size=len(tokenizer), d_model=HIDDEN, d_kv=D_HEAD, d_ff=64, num_layers=2,
                      num_heads=HEADS, dropout_rate=0.0, pad_token_id=pad, eos_token_id=eos,
                      decoder_start_token_id=pad)  # fmt: skip
    args = Seq2SeqTrainingArguments(
        output_dir=str(root / "runs" / "polarity_t5"),
        max_steps=STEPS[-1],
        per_device_train_batch_size=16,
        learning_rate=5e-3,
        save_strategy="steps",
        save_steps=STEPS[0],
        report_to="none",
        use_cpu=True,
        seed=SEED,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    Seq2SeqTrainer(
        model=T5ForConditionalGeneration(config),
        args=args,
        train_dataset=encode(frames["train"]),
        data_collator=collate,
    ).train()
    return {"data": data, "tokenizer": tokenizer_dir, "runs": root / "runs" / "polarity_t5",
            "test": collate(encode(frames["test"])), "train": collate(encode(frames["train"])),
            "test_table": frames["test"]}  # fmt: skip


TRAINED_T5 = {"model_type": "t5", "d_model": HIDDEN, "d_kv": D_HEAD, "d_ff": 64, "num_layers": 2,
              "num_heads": HEADS, "dropout_rate": 0.0, "pad_token_id": 0, "eos_token_id": 1,
              "decoder_start_token_id": 0}  # fmt: skip


def user_config(project: dict) -> dict:
    cfg = yaml.safe_load((REPO / "config" / "examples" / "text_to_text.yaml").read_text())
    run = cfg["runs"]["polarity_t5"]
    run["data"]["path"] = str(project["data"])
    run["data"]["text"]["tokenizer"] = str(project["tokenizer"])
    run["checkpoints"]["path"] = str(project["runs"] / "checkpoint-{epoch}")
    run["curvature"]["n_directions"] = 4  # small: the test's time
    run["ablation"]["modes"] = ["zero"]
    run["ablation"]["epochs"] = [STEPS[-1]]
    run["features"]["epochs"] = [STEPS[-1]]  # features and probes of the last checkpoint
    run["probes"]["seeds"] = [0]  # one probe per block and representation: the test's time
    run["influence"]["queries"]["max_count"] = 8
    cfg["device"] = "cpu"
    # the example's T5 the pipeline trains from its config (polarity_t5_lds): its LDS (4 retrainings
    # on halves of the data, 8 queries), evaluated at the last epoch only (the test's time)
    trained = cfg["runs"].pop("polarity_t5_lds")
    assert trained["model"]["hf"]["config"] == TRAINED_T5  # what the tests below rebuild
    trained["data"]["path"] = str(project["data"])
    trained["data"]["text"]["tokenizer"] = str(project["tokenizer"])
    trained["epochs"] = [4]
    trained["influence"]["queries"]["max_count"] = 8
    trained["influence"]["lds"].update(subsets=LDS_SUBSETS, bootstrap=100)
    trained["samples"] = {"enabled": False}  # a T5's dossier: polarity_t5's (the test's time)
    cfg["runs"]["trained_t5"] = trained
    return cfg


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    project = write_project(root / "project")
    wf = copy_workflow(root / "wf")
    work = root / "work"
    work.mkdir()
    cfg = write_config(root / "config.yaml", user_config(project))
    snakemake(wf, work, configfile=cfg)
    return project, Layout(work / "results")


def load(project: dict, step: int):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()


def per_sample_loss(model, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own loss of each sample alone (unpadded) and exact match (teacher forcing)."""
    losses, exact = [], []
    with torch.no_grad():
        for i in range(len(batch["input_ids"])):
            real, target = batch["attention_mask"][i].bool(), batch["labels"][i] != -100
            ids, labels = batch["input_ids"][i, real][None], batch["labels"][i, target][None]
            out = model(input_ids=ids, labels=labels)
            losses.append(float(out.loss))
            exact.append(bool((out.logits[0].argmax(-1) == labels[0]).all()))
    return np.array(losses), np.array(exact)


@pytest.mark.quality
def test_evaluation_is_the_users_model_loss_per_group(t5_run):
    project, paths = t5_run
    groups = pd.read_csv(paths.table("accuracy_per_group", "polarity_t5"))
    names = project["test_table"]["group"].to_numpy()
    for step in STEPS:
        loss, exact = per_sample_loss(load(project, step), project["test"])
        rows = groups[(groups["epoch"] == step) & (groups["split"] == "test")].set_index("data_group")
        assert sorted(rows.index) == sorted(set(names))
        for g in rows.index:
            assert rows.loc[g, "n"] == (names == g).sum()
            assert rows.loc[g, "n_correct"] == exact[names == g].sum(), g
            np.testing.assert_allclose(rows.loc[g, "mean_loss"], loss[names == g].mean(), rtol=1e-5)
    # the model has learned to write a label word and </s>: far below an untrained model's loss of
    # about ln(vocabulary) = 3.8 nats per token, and some test sentences exactly right
    last = groups[(groups["epoch"] == STEPS[-1]) & (groups["split"] == "test")]
    above("test sentences exactly right at the last step", last["n_correct"].sum(), 0, last)
    below("test loss per token at the last step, worst group", last["mean_loss"].max(), 1.5, last)


@pytest.mark.parametrize(
    "site, head",
    [
        ("encoder.block.1.layer.0.SelfAttention.o", 1),
        ("decoder.block.0.layer.0.SelfAttention.o", 0),
        ("decoder.block.1.layer.1.EncDecAttention.o", 1),
    ],
)
def test_head_ablation_equals_zeroed_output_projection_columns(t5_run, site, head):
    project, paths = t5_run
    step = STEPS[-1]
    table = pd.read_csv(paths.table("ablation", "polarity_t5"))
    table = table[(table["epoch"] == step) & (table["mode"] == "zero")]
    model = load(project, step)
    base_loss, _ = per_sample_loss(model, project["test"])
    with torch.no_grad():
        dict(model.named_modules())[site].weight[:, head * D_HEAD : (head + 1) * D_HEAD] = 0
    loss, _ = per_sample_loss(model, project["test"])
    assert np.abs(loss - base_loss).max() > 1e-4  # the head matters: the check can fail
    unit = table[(table["block"] == site) & (table["group"] == f"head {head}")].set_index("cohort")
    names = project["test_table"]["group"].to_numpy()
    np.testing.assert_allclose(unit.loc["all", "loss_base_mean"], base_loss.mean(), rtol=1e-5)
    np.testing.assert_allclose(unit.loc["all", "delta_loss_mean"], (loss - base_loss).mean(), atol=1e-5)
    for g in set(names):
        row = unit.loc[f"data: {g}"]
        np.testing.assert_allclose(row["delta_loss_mean"], (loss - base_loss)[names == g].mean(), atol=1e-5)


def test_curvature_of_every_training_sample_at_every_checkpoint(t5_run):
    project, paths = t5_run
    n = len(project["train"]["input_ids"])
    from epochlens.data.text_rows import read_text_dataset

    data = read_text_dataset(paths.dataset("polarity_t5"))  # as the Trainer saw them: word, </s>
    np.testing.assert_array_equal(data.train_labels, project["train"]["labels"].numpy())
    width = project["train"]["input_ids"].shape[1]  # the data set pads to the longest of both splits
    np.testing.assert_array_equal(data.train_input_ids[:, :width], project["train"]["input_ids"].numpy())
    assert (data.train_input_ids[:, width:] == 0).all()
    losses = []
    for step in STEPS:
        meta = json.loads(Path(paths.curvature_metadata("polarity_t5", 0, step)).read_text())
        assert meta["epoch"] == step and meta["allowed_classes"] == [0]
        got = {
            key: np.load(paths.curvature_array(key, "polarity_t5", 0, step))
            for key in ("curvature", "directional_eig", "loss", "grad_norm", "correct", "labels")
        }
        assert all(a.shape == (n,) for a in got.values())
        for key in ("curvature", "directional_eig", "loss", "grad_norm"):
            assert np.isfinite(got[key]).all(), (step, key)
        assert (got["curvature"] > 0).all() and (got["labels"] == 0).all()
        loss, exact = per_sample_loss(load(project, step), project["train"])
        np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
        np.testing.assert_array_equal(got["correct"], exact)
        losses.append(loss)
    samples = pd.read_csv(paths.table("sample_dynamics", "polarity_t5")).sort_values("sample")
    assert len(samples) == n
    np.testing.assert_allclose(samples["csl"], np.sum(losses, axis=0), rtol=1e-5)


def test_a_t5_trained_by_the_pipeline_from_its_config(t5_run):
    """model.hf.config with task text_to_text: the pipeline trains it (one class, the target tokens),
    its checkpoints are state_dicts that transformers' T5 loads, and the evaluation of each is that
    model's own loss of each test sample alone."""
    from transformers import T5Config, T5ForConditionalGeneration

    project, paths = t5_run
    log = pd.read_csv(paths.train_log("trained_t5", 0))
    assert list(log["epoch"]) == [1, 2, 3, 4] and log["train_loss"].iloc[-1] < log["train_loss"].iloc[0]
    groups = pd.read_csv(paths.table("accuracy_per_group", "trained_t5"))
    names = project["test_table"]["group"].to_numpy()
    assert sorted(set(groups["epoch"])) == [4]
    assert Path(paths.checkpoint("trained_t5", 0, 0)).is_file()
    sizes = {k: v for k, v in TRAINED_T5.items() if k != "model_type"}
    state = torch.load(paths.checkpoint("trained_t5", 0, 4), map_location="cpu")
    model = T5ForConditionalGeneration(T5Config(**sizes, vocab_size=state["shared.weight"].shape[0]))
    model.load_state_dict(state)
    loss, exact = per_sample_loss(model.eval(), project["test"])
    rows = groups[groups["split"] == "test"].set_index("data_group")
    assert sorted(rows.index) == sorted(set(names))
    for g in rows.index:
        np.testing.assert_allclose(rows.loc[g, "mean_loss"], loss[names == g].mean(), rtol=1e-5)
        assert rows.loc[g, "n_correct"] == exact[names == g].sum()


def test_the_dossier_is_the_users_model_loss_and_exact_match(t5_run):
    """A text-to-text model's dossier: each training sample's loss and exact match (teacher
    forcing) at the last checkpoint are transformers' own; no label, no data map."""
    project, paths = t5_run
    rows = check_training_rows(paths, "polarity_t5", 0)
    dossier, meta = read_dossier(paths, "polarity_t5")
    assert meta["task"] == "text_to_text" and {"label", "p_label", "aum"}.isdisjoint(dossier)
    loss, exact = per_sample_loss(load(project, STEPS[-1]), project["train"])
    np.testing.assert_allclose(np.stack(rows["loss"].to_numpy())[:, -1], loss, rtol=1e-4)
    np.testing.assert_array_equal(np.stack(rows["correct"].to_numpy())[:, -1], exact)
    check_influence(paths, "polarity_t5", 0, STEPS[-1], ["ekfac", "identity"])
    check_detectors(rows, meta)
    assert not Path(paths.figure("data_map", "png", "polarity_t5")).exists()


def test_influence_of_every_training_sample_and_the_users_poisons(t5_run):
    """EK-FAC and gradient-dot-product influence at the last checkpoint: every training sample
    scored (its loss transformers' own loss of it alone), queries = test prompts under their own
    targets, and the user's flipped answers (data.ground_truth) the detection table's ground truth."""
    from epochlens.data.text_rows import read_text_dataset

    project, paths = t5_run
    step, n = STEPS[-1], len(project["train"]["input_ids"])
    loss, _ = per_sample_loss(load(project, step), project["train"])
    for method in ("ekfac", "identity"):
        meta = json.loads(
            Path(paths.influence_file("metadata.json", "polarity_t5", 0, step, method)).read_text()
        )
        assert meta["n_train"] == meta["n_scored"] == n, meta
        scores = np.load(paths.influence_file("scores.npz", "polarity_t5", 0, step, method))
        assert np.isfinite(scores["self_influence"]).all() and len(scores["self_influence"]) == n
        assert (scores["self_influence"] > 0).all()  # g·P g with P positive definite
        assert scores["pairwise_none"].shape == (8, n) and np.isfinite(scores["pairwise_none"]).all()
        np.testing.assert_allclose(scores["loss"], loss, rtol=1e-5)
        queries = {k: scores[k] for k in scores.files if k.startswith("query_")}
    assert sorted(queries), queries  # the test prompts the scores attribute
    data = read_text_dataset(paths.dataset("polarity_t5"))
    np.testing.assert_array_equal(np.flatnonzero(data.ground_truth), FLIPPED)
    np.testing.assert_array_equal(np.load(paths.corrupted_indices("polarity_t5")), FLIPPED)
    detection = pd.read_csv(paths.table("poison_detection", "polarity_t5"))
    assert set(detection["status"]) == {"ok"} and detection["auroc"].notna().all()
    assert {"ekfac", "identity"} <= set(detection["method"])


def test_lds_of_the_t5_trained_by_the_pipeline(t5_run):
    """influence.lds on the pipeline's T5: 4 retrainings on half the training samples, each
    measuring every test sample's target-token loss; the LDS table has a finite correlation and
    interval for each method and the random reference, over the same 8 queries as the scores."""
    project, paths = t5_run
    parts = np.load(paths.lds_part("trained_t5", 0, 4, 0, 1))
    n_train, n_test = len(project["train"]["input_ids"]), len(project["test"]["input_ids"])
    assert parts["test_losses"].shape == (LDS_SUBSETS, n_test) and np.isfinite(parts["test_losses"]).all()
    assert (parts["masks"].sum(1) == n_train // 2).all() and "log_probs" not in parts.files
    # the retrainings differ from each other: the losses vary over the subsets for every query
    assert (parts["test_losses"].std(0) > 0).all()
    lds = pd.read_csv(paths.table("lds", "trained_t5")).set_index("method")
    assert set(lds.index) == {"ekfac", "identity", "random"}
    for column in ("lds", "ci_low", "ci_high"):
        assert np.isfinite(lds[column]).all(), column
    assert (lds["n_queries"] == 8).all() and (lds["n_subsets"] == LDS_SUBSETS).all()
    assert (lds["ci_low"] <= lds["lds"]).all() and (lds["lds"] <= lds["ci_high"]).all()
    queries = pd.read_csv(paths.table("lds_queries", "trained_t5"))
    assert len(queries) == 3 * 8 and np.isfinite(queries["spearman"]).all()
    scores = np.load(paths.influence_file("scores.npz", "trained_t5", 0, 4, "ekfac"))
    assert sorted(set(queries["test_index"])) == sorted(scores["query_test_indices"])
    assert Path(paths.figure("lds", "png", "trained_t5")).is_file()


ENCODER_BLOCKS = ["encoder.block.0", "encoder.block.1"]
DECODER_BLOCKS = ["decoder.block.0", "decoder.block.1"]


def test_features_are_the_hidden_states_of_every_encoder_and_decoder_block(t5_run):
    """Encoder blocks over the prompt's real tokens, decoder blocks over the target positions
    (teacher-forced with the decoder labels): mean and first, as transformers computes them on the
    Trainer's padded batch (block 0 of each stack: the last hidden state has the final norm)."""
    from epochlens.features.cache import FeatureSet

    project, paths = t5_run
    step = STEPS[-1]
    features = FeatureSet(paths.features("polarity_t5", 0, step))
    assert features.layers == ENCODER_BLOCKS + DECODER_BLOCKS
    assert features.representations == ["mean", "first"]
    batch = project["train"]
    with torch.no_grad():
        out = load(project, step)(**batch, output_hidden_states=True)
    for stack, h, mask in (
        ("encoder", out.encoder_hidden_states[1], batch["attention_mask"]),
        ("decoder", out.decoder_hidden_states[1], batch["labels"] != -100),
    ):
        m = mask.to(h.dtype)[:, :, None]
        layer = f"{stack}.block.0"
        np.testing.assert_allclose(
            features.array("train", layer, "mean"), ((h * m).sum(1) / m.sum(1)).numpy(), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(
            features.array("train", layer, "first"), h[:, 0].numpy(), rtol=1e-4, atol=1e-5
        )
    assert features.array("test", DECODER_BLOCKS[1], "mean").shape == (
        len(project["test"]["input_ids"]),
        HIDDEN,
    )


def test_probes_of_the_groups_per_encoder_and_decoder_block(t5_run):
    _, paths = t5_run
    table = pd.read_csv(paths.table("probes", "polarity_t5"))
    group = table[(table["target"] == "group") & (table["eval_split"] == "test")]
    assert set(group["layer"]) == set(ENCODER_BLOCKS + DECODER_BLOCKS)
    assert set(group["representation"]) == {"mean", "first"} and set(group["epoch"]) == {STEPS[-1]}
    assert len(group) == 8 and (group["status"] == "ok").all()
    assert np.isfinite(group["accuracy_mean"]).all() and group["accuracy_mean"].between(0, 1).all()
    # curvature bins: a training-only target with no training holdout in this data, said so
    curvature = table[table["target"] == "curvature_q4"]
    assert (
        len(curvature) == 8 and curvature["status"].str.startswith("skipped: the data has no training").all()
    )
    assert Path(paths.figure("probe_accuracy", "png", "polarity_t5")).stat().st_size > 10_000
