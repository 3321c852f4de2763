"""A text classifier the user trained with the Hugging Face Trainer, through the pipeline:
config/examples/text_classifier.yaml with its paths pointed at a project made here in the real
formats: sentences in train.jsonl / test.jsonl (label names, a group column), a tokenizer saved
with save_pretrained, and a tiny BERT trained by transformers.Trainer, which wrote
``checkpoint-{step}/`` folders (config.json + model.safetensors).

What epochlens reports must be what the user's own model predicts: the evaluation table at every
checkpoint equals the counts of correct predictions that transformers gives on the test sentences
(tokenised and padded the user's way, to max_length), per class and per group; influence scores
every training sentence and its figure lists texts; the features of the last checkpoint are the
user's model's hidden states (padded the pipeline's way: to 64 tokens, not 24).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from dossier_checks import check_detectors, check_influence, check_summaries, check_training_rows
from dossier_checks import read as read_dossier
from wfutil import REPO, copy_workflow, snakemake, write_config

from epochlens.data.polarity import polarity_tables, write_polarity_tokenizer
from epochlens.layout import Layout

pytestmark = [pytest.mark.slow, pytest.mark.workflow]

STEPS = (10, 20)  # the Trainer's checkpoints: every 10 steps of 20


def write_project(root: Path) -> dict:
    """The user's data, tokenizer and Trainer run under ``root``; returns paths and test rows."""
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainingArguments,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tables = polarity_tables(n_train=160, n_test=48, seed=3)
    # The user's own poisoning before training: 16 training labels flipped, marked in a column.
    flipped = np.sort(np.random.default_rng(5).choice(160, size=16, replace=False))
    train = tables["train"]
    train["poisoned"] = np.isin(np.arange(160), flipped)
    train.loc[train["poisoned"], "label"] = train.loc[train["poisoned"], "label"].map(
        {"negative": "positive", "positive": "negative"}
    )
    data = root / "data" / "sst"
    data.mkdir(parents=True)
    for split, df in tables.items():
        df.rename(columns={"text": "sentence"}).to_json(data / f"{split}.jsonl", orient="records", lines=True)
    tokenizer_dir = write_polarity_tokenizer(root / "runs" / "sst" / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    label_ids = {"negative": 0, "positive": 1}  # the pipeline sorts label names: the same ids

    class Sentences(torch.utils.data.Dataset):
        def __init__(self, df: pd.DataFrame) -> None:
            self.enc = tokenizer(list(df["text"]), padding="max_length", max_length=24, return_tensors="pt")
            self.labels = torch.tensor([label_ids[v] for v in df["label"]])

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.enc["input_ids"][i], "attention_mask": self.enc["attention_mask"][i],
                    "labels": self.labels[i]}  # fmt: skip

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2,
                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    args = TrainingArguments(
        output_dir=str(root / "runs" / "sst"),
        max_steps=STEPS[-1],
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=STEPS[0],
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    Trainer(
        model=BertForSequenceClassification(config), args=args, train_dataset=Sentences(tables["train"])
    ).train()
    test = Sentences(tables["test"])
    return {"data": data, "tokenizer": tokenizer_dir, "runs": root / "runs" / "sst", "test": test,
            "test_table": tables["test"], "flipped": flipped}  # fmt: skip


def user_config(project: dict) -> dict:
    cfg = yaml.safe_load((REPO / "config" / "examples" / "text_classifier.yaml").read_text())
    run = cfg["runs"]["sst"]
    run["data"]["path"] = str(project["data"])
    run["data"]["text"]["tokenizer"] = str(project["tokenizer"])
    run["checkpoints"]["path"] = str(project["runs"] / "checkpoint-{epoch}")
    run["influence"]["queries"]["max_count"] = 8
    run["features"] = {"enabled": True, "epochs": [STEPS[-1]]}  # probes stay off: one cheap job
    cfg["device"] = "cpu"
    return cfg


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    project = write_project(root / "project")
    wf = copy_workflow(root / "wf")
    work = root / "work"
    work.mkdir()
    cfg = write_config(root / "config.yaml", user_config(project))
    snakemake(wf, work, configfile=cfg)
    return project, Layout(work / "results")


def test_evaluation_is_what_the_users_model_predicts(text_run):
    from transformers import AutoModelForSequenceClassification

    project, paths = text_run
    per_class = pd.read_csv(paths.table("accuracy_per_class", "sst"))
    groups = pd.read_csv(paths.table("accuracy_per_group", "sst"))
    test = project["test"]
    names = project["test_table"]["group"].to_numpy()
    for step in STEPS:
        model = AutoModelForSequenceClassification.from_pretrained(
            project["runs"] / f"checkpoint-{step}"
        ).eval()
        with torch.no_grad():
            logits = model(input_ids=test.enc["input_ids"], attention_mask=test.enc["attention_mask"]).logits
        correct = (logits.argmax(1) == test.labels).numpy()
        rows = per_class[(per_class["epoch"] == step) & (per_class["split"] == "test")]
        for c in (0, 1):
            assert rows[rows["class_id"] == c]["n_correct"].sum() == correct[test.labels.numpy() == c].sum()
        by_group = groups[(groups["epoch"] == step) & (groups["split"] == "test")].set_index("data_group")
        assert sorted(by_group.index) == ["contrast", "intensified", "negated", "plain"]
        for g in by_group.index:
            assert by_group.loc[g, "n_correct"] == correct[names == g].sum(), g


def test_influence_scores_every_training_sentence_and_lists_texts(text_run):
    _, paths = text_run
    for method in ("ekfac", "identity"):
        meta = json.loads(
            Path(paths.influence_file("metadata.json", "sst", 0, STEPS[-1], method)).read_text()
        )
        assert meta["n_train"] == meta["n_scored"] == 160, meta
        scores = np.load(paths.influence_file("scores.npz", "sst", 0, STEPS[-1], method))["self_influence"]
        assert np.isfinite(scores).all() and len(scores) == 160
    assert Path(paths.figure("top_influential_images", "png", "sst")).stat().st_size > 10_000


def test_the_users_own_poisons_are_the_ground_truth_of_the_detection_table(text_run):
    """data.ground_truth.column: the user flipped 16 labels before training and marked them; the
    detection table measures every signal against them (AUROC filled, status ok)."""
    project, paths = text_run
    np.testing.assert_array_equal(np.load(paths.corrupted_indices("sst")), project["flipped"])
    detection = pd.read_csv(paths.table("poison_detection", "sst"))
    assert set(detection["status"]) == {"ok"} and detection["auroc"].notna().all()
    # (20 Trainer steps barely fit the data: the AUROCs themselves say little here)


def test_features_are_the_users_models_hidden_states(text_run):
    from transformers import AutoModelForSequenceClassification

    from epochlens.features.cache import FeatureSet

    project, paths = text_run
    features = FeatureSet(paths.features("sst", 0, STEPS[-1]))
    assert features.layers == ["bert.encoder.layer.0"] and features.representations == ["mean", "last"]
    test = project["test"]
    model = AutoModelForSequenceClassification.from_pretrained(project["runs"] / f"checkpoint-{STEPS[-1]}")
    with torch.no_grad():
        inputs = {k: test.enc[k] for k in ("input_ids", "attention_mask")}
        hidden = model.eval()(**inputs, output_hidden_states=True).hidden_states[1].numpy()
    mask = test.enc["attention_mask"].numpy()
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    last = hidden[np.arange(len(hidden)), mask.sum(1) - 1]  # right padding
    np.testing.assert_allclose(features.array("test", "bert.encoder.layer.0", "mean"), mean, atol=1e-5)
    np.testing.assert_allclose(features.array("test", "bert.encoder.layer.0", "last"), last, atol=1e-5)


def test_the_dossier_holds_the_users_sentences_and_their_models_probabilities(text_run):
    """samples/dossier.parquet of the user's run: its sentences, the poisons they marked, and at
    the last checkpoint the probability that their own model (run by transformers, tokenised their
    way) gives each training sentence's label; every column against the files it comes from."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    project, paths = text_run
    rows = check_training_rows(paths, "sst", 0)
    check_summaries(rows)
    dossier, meta = read_dossier(paths, "sst")
    assert meta["task"] == "text_classification" and "image" not in dossier
    train = pd.read_json(project["data"] / "train.jsonl", lines=True)
    assert rows["text"].tolist() == train["sentence"].tolist()
    np.testing.assert_array_equal(
        rows["is_corrupted"].astype(bool), np.isin(np.arange(160), project["flipped"])
    )
    tokenizer = AutoTokenizer.from_pretrained(str(project["tokenizer"]), local_files_only=True)
    enc = tokenizer(list(train["sentence"]), padding="max_length", max_length=24, return_tensors="pt")
    model = AutoModelForSequenceClassification.from_pretrained(project["runs"] / f"checkpoint-{STEPS[-1]}")
    with torch.no_grad():
        logits = model.eval()(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    p = logits.double().softmax(1)[np.arange(160), torch.tensor(rows["label"].to_numpy(np.int64))]
    np.testing.assert_allclose(np.stack(rows["p_label"].to_numpy())[:, -1], p.numpy(), atol=1e-5)
    check_influence(paths, "sst", 0, STEPS[-1], ["ekfac", "identity"])
    check_detectors(rows, meta)
    assert Path(paths.figure("data_map", "png", "sst")).stat().st_size > 10_000
