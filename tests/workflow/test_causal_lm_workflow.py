"""A causal language model the user trained with the Hugging Face Trainer, through the pipeline:
config/examples/causal_lm.yaml with its paths pointed at a project made here in the real formats:
prompts and targets in four groups (facts, counterfactual, negation, logic) in train.jsonl /
test.jsonl, a word-level tokenizer saved with save_pretrained, and a tiny GPT-2 trained by
transformers.Trainer on prompt + target with the prompt's labels -100, which wrote
``checkpoint-{step}/`` folders.

What epochlens reports must be what the user's model does: the evaluation's mean loss per group
is the mean of transformers' own loss of each test sample (labels = its target tokens), exact
match is every target token the model's top choice; the head-ablation table has every layer x
head per prompt group, and zeroing a head's output equals the model with that head's columns of
the output projection (GPT-2's ``attn.c_proj``) set to zero; every training sequence has its
curvature at every checkpoint, and the loss the curvature stage differentiates is transformers' own
loss of that sample alone (CSL: their sum over the checkpoints). Features are the model's own
``output_hidden_states`` at the last prompt token and averaged over the target tokens; probes tell
the prompt groups apart; influence (task language_model, queries = the test prompts with their
targets) gives gradient dot products equal to those of transformers' own loss, and finds the
user's poisoned samples (facts taught with a wrong capital, marked in a ``poisoned`` column:
data.ground_truth). A tiny Llama with grouped-query attention (2 query heads share 1 key/value
head), trained by the Trainer from a config, goes through evaluation and influence too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from dossier_checks import check_detectors, check_training_rows
from dossier_checks import check_influence as check_dossier_influence
from dossier_checks import read as read_dossier
from quality import SEED, above, at_least, below
from wfutil import REPO, copy_workflow, snakemake, write_config

from epochlens.layout import Layout

pytestmark = [pytest.mark.slow, pytest.mark.workflow]

STEPS = (100, 200)  # the Trainer's checkpoints: every 100 steps of 200
GROUPS = ("counterfactual", "facts", "logic", "negation")
LAYERS, HEADS = 2, 2

COUNTRIES = [f"land{i}" for i in range(8)]
CITIES = [f"city{i}" for i in range(8)]
WORDS = [f"w{i}" for i in range(8)]
POISONED = [i for i in range(160) if GROUPS[i % 4] == "facts"][::5]  # 8 of the 40 facts


def prompt_tables(seed: int) -> dict[str, pd.DataFrame]:
    """Prompts and targets of four groups: a fact to recall, a counterfactual premise to copy, a
    negated wrong answer to look past, and a modus ponens over random words."""
    rng = np.random.default_rng(seed)
    capital = dict(zip(COUNTRIES, CITIES, strict=True))

    def row(group: str) -> dict:
        land = str(rng.choice(COUNTRIES))
        other = str(rng.choice([c for c in CITIES if c != capital[land]]))
        a, b = (str(w) for w in rng.choice(WORDS, 2, replace=False))
        prompt, target = {
            "facts": (f"the capital of {land} is", capital[land]),
            "counterfactual": (
                f"suppose the capital of {land} were {other} . the capital of {land} is",
                other,
            ),
            "negation": (f"the capital of {land} is not {other} . the capital of {land} is", capital[land]),
            "logic": (f"if {a} then {b} . {a} . so", f"{b} ."),
        }[group]
        return {"prompt": prompt, "target": target, "group": group}

    tables = {
        split: pd.DataFrame([row(GROUPS[i % 4]) for i in range(n)])
        for split, n in (("train", 160), ("test", 48))
    }
    # The user's poisons: POISONED facts taught with a wrong capital, marked in a boolean column.
    for table in tables.values():
        table["poisoned"] = False
    train = tables["train"]
    for i in POISONED:
        land = train.loc[i, "prompt"].split()[3]
        train.loc[i, "target"] = CITIES[(CITIES.index(capital[land]) + 3) % len(CITIES)]
        train.loc[i, "poisoned"] = True
    return tables


def write_tokenizer(folder: Path) -> Path:
    """A GPT-2-like word-level tokenizer (no special tokens added, padding on the right)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<eos>", ".", "the", "capital", "of", "is", "not", "suppose", "were", "if",
             "then", "so", *COUNTRIES, *CITIES, *WORDS]  # fmt: skip
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(str(folder))
    return folder


def tiny_model(family: str, vocab: int, pad: int):
    """The user's model, from a config: a GPT-2, or a Llama with grouped-query attention."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    if family == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                             num_attention_heads=HEADS, num_key_value_heads=1, max_position_embeddings=32,
                             pad_token_id=pad)  # fmt: skip
        return LlamaForCausalLM(config)
    config = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=LAYERS, n_head=HEADS, n_positions=32,
                        pad_token_id=pad)  # fmt: skip
    return GPT2LMHeadModel(config)


def write_project(root: Path, family: str = "gpt2", steps: tuple[int, ...] = STEPS) -> dict:
    """The user's data, tokenizer and Trainer run under ``root``."""
    from transformers import AutoTokenizer, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tables = prompt_tables(seed=5 + SEED)
    data = root / "data" / "prompts"
    data.mkdir(parents=True)
    for split, df in tables.items():
        df.to_json(data / f"{split}.jsonl", orient="records", lines=True)
    tokenizer_dir = write_tokenizer(root / "runs" / "prompts" / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)

    def encode(df: pd.DataFrame) -> list[dict]:
        rows = []
        for prompt, target in zip(df["prompt"], df["target"], strict=True):
            p, t = tokenizer(prompt)["input_ids"], tokenizer(target)["input_ids"]
            rows.append({"input_ids": torch.tensor(p + t), "labels": torch.tensor([-100] * len(p) + t)})
        return rows

    def collate(rows: list[dict]) -> dict:
        length = max(len(r["input_ids"]) for r in rows)
        out = {k: torch.full((len(rows), length), v) for k, v in (("input_ids", 0), ("labels", -100))}
        out["attention_mask"] = torch.zeros(len(rows), length, dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            out["input_ids"][i, :n], out["labels"][i, :n], out["attention_mask"][i, :n] = (
                r["input_ids"],
                r["labels"],
                1,
            )
        return out

    model = tiny_model(family, len(tokenizer), tokenizer.pad_token_id)
    args = TrainingArguments(
        output_dir=str(root / "runs" / "prompts"),
        max_steps=steps[-1],
        per_device_train_batch_size=16,
        learning_rate=5e-3,
        save_strategy="steps",
        save_steps=steps[0],
        report_to="none",
        use_cpu=True,
        seed=SEED,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    Trainer(model=model, args=args, train_dataset=encode(tables["train"]), data_collator=collate).train()
    return {"data": data, "tokenizer": tokenizer_dir, "runs": root / "runs" / "prompts",
            "test": collate(encode(tables["test"])), "test_table": tables["test"],
            "train": collate(encode(tables["train"])), "steps": steps}  # fmt: skip


def user_config(project: dict) -> dict:
    cfg = yaml.safe_load((REPO / "config" / "examples" / "causal_lm.yaml").read_text())
    run = cfg["runs"]["prompts"]
    run["data"]["path"] = str(project["data"])
    run["data"]["text"]["tokenizer"] = str(project["tokenizer"])
    run["checkpoints"]["path"] = str(project["runs"] / "checkpoint-{epoch}")
    run["data"]["ground_truth"] = {"column": "poisoned"}  # the user's own poisons
    run["probes"]["seeds"] = [0]  # one probe per layer and representation: the suite stays short
    cfg["device"] = "cpu"
    return cfg


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    project = write_project(root / "project")
    wf = copy_workflow(root / "wf")
    work = root / "work"
    work.mkdir()
    cfg = write_config(root / "config.yaml", user_config(project))
    snakemake(wf, work, configfile=cfg)
    return project, Layout(work / "results")


def per_sample_loss(model, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own loss of each sample alone (mean NLL of its target tokens) and exact match."""
    losses, exact = [], []
    with torch.no_grad():
        for i in range(len(batch["input_ids"])):
            one = {k: v[i : i + 1] for k, v in batch.items()}
            out = model(**one)
            losses.append(float(out.loss))
            targets = one["labels"][0, 1:]
            predicted = out.logits[0, :-1].argmax(-1)
            exact.append(bool((predicted == targets)[targets != -100].all()))
    return np.array(losses), np.array(exact)


def test_evaluation_is_the_users_model_loss_per_group(lm_run):
    from transformers import AutoModelForCausalLM

    project, paths = lm_run
    groups = pd.read_csv(paths.table("accuracy_per_group", "prompts"))
    names = project["test_table"]["group"].to_numpy()
    for step in STEPS:
        model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()
        loss, exact = per_sample_loss(model, project["test"])
        rows = groups[(groups["epoch"] == step) & (groups["split"] == "test")].set_index("data_group")
        assert sorted(rows.index) == list(GROUPS)
        for g in GROUPS:
            assert rows.loc[g, "n"] == (names == g).sum()
            assert rows.loc[g, "n_correct"] == exact[names == g].sum(), g
            np.testing.assert_allclose(rows.loc[g, "mean_loss"], loss[names == g].mean(), rtol=1e-5)
    # the model learns: the last checkpoint's loss is below the first's
    assert (
        groups[groups["epoch"] == STEPS[-1]]["mean_loss"].mean()
        < groups[groups["epoch"] == STEPS[0]]["mean_loss"].mean()
    )


def test_head_ablation_per_prompt_group_equals_zeroed_projection(lm_run):
    from transformers import AutoModelForCausalLM

    project, paths = lm_run
    step = STEPS[-1]
    table = pd.read_csv(paths.table("ablation", "prompts"))
    table = table[(table["epoch"] == step) & (table["mode"] == "zero")]
    cohorts = {f"data: {g}" for g in GROUPS} | {"all"}
    for layer in range(LAYERS):
        for head in range(HEADS):
            unit = table[
                (table["block"] == f"transformer.h.{layer}.attn.c_proj") & (table["group"] == f"head {head}")
            ]
            assert set(unit["cohort"]) == cohorts, (layer, head)
    model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()
    base_loss, _ = per_sample_loss(model, project["test"])
    with torch.no_grad():
        model.transformer.h[1].attn.c_proj.weight[16:32].zero_()  # Conv1D: (in, out); head 1's inputs
    loss, _ = per_sample_loss(model, project["test"])
    names = project["test_table"]["group"].to_numpy()
    unit = table[(table["block"] == "transformer.h.1.attn.c_proj") & (table["group"] == "head 1")]
    unit = unit.set_index("cohort")
    for g in GROUPS:
        row = unit.loc[f"data: {g}"]
        np.testing.assert_allclose(row["loss_base_mean"], base_loss[names == g].mean(), rtol=1e-5)
        np.testing.assert_allclose(row["delta_loss_mean"], (loss - base_loss)[names == g].mean(), atol=1e-5)
    assert Path(paths.figure("ablation_effect", "png", "prompts")).stat().st_size > 10_000


def test_the_dossier_is_the_users_model_loss_of_every_training_sequence(lm_run):
    """A causal LM's dossier: each training sequence's loss and exact match at the last checkpoint
    are transformers' own; no label, no probability of one, no data map (refused, not computed)."""
    from transformers import AutoModelForCausalLM

    project, paths = lm_run
    rows = check_training_rows(paths, "prompts", 0)
    dossier, meta = read_dossier(paths, "prompts")
    assert meta["task"] == "causal_lm" and {"label", "p_label", "margin", "confidence", "aum"}.isdisjoint(
        dossier
    )
    model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{STEPS[-1]}").eval()
    loss, exact = per_sample_loss(model, project["train"])
    np.testing.assert_allclose(np.stack(rows["loss"].to_numpy())[:, -1], loss, rtol=1e-4)
    np.testing.assert_array_equal(np.stack(rows["correct"].to_numpy())[:, -1], exact)
    assert {"learning_time", "forgetting_events", "csl", "curvature_mean"} <= set(dossier)
    check_dossier_influence(paths, "prompts", 0, STEPS[-1], ["ekfac"])
    check_detectors(rows, meta)
    assert not Path(paths.figure("data_map", "png", "prompts")).exists()


def test_curvature_of_every_training_sequence_at_every_checkpoint(lm_run):
    from transformers import AutoModelForCausalLM

    project, paths = lm_run
    n = len(project["train"]["input_ids"])
    losses = []
    for step in STEPS:
        meta = json.loads(Path(paths.curvature_metadata("prompts", 0, step)).read_text())
        assert meta["epoch"] == step and meta["allowed_classes"] == [0]
        got = {
            key: np.load(paths.curvature_array(key, "prompts", 0, step))
            for key in ("curvature", "directional_eig", "loss", "grad_norm", "correct", "labels")
        }
        assert all(a.shape == (n,) for a in got.values())
        for key in ("curvature", "directional_eig", "loss", "grad_norm"):
            assert np.isfinite(got[key]).all(), (step, key)  # every sequence has a target
        assert (got["curvature"] > 0).all() and (got["labels"] == 0).all()  # one class: target tokens
        model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()
        loss, exact = per_sample_loss(model, project["train"])
        np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
        np.testing.assert_array_equal(got["correct"], exact)
        losses.append(loss)
    samples = pd.read_csv(paths.table("sample_dynamics", "prompts")).sort_values("sample")
    assert len(samples) == n and (samples["label"] == 0).all()
    np.testing.assert_allclose(samples["csl"], np.sum(losses, axis=0), rtol=1e-5)


def test_features_are_the_hidden_states_at_the_last_prompt_token_and_over_the_targets(lm_run):
    from transformers import AutoModelForCausalLM

    from epochlens.features.cache import FeatureSet

    project, paths = lm_run
    step = STEPS[-1]
    features = FeatureSet(paths.features("prompts", 0, step))
    blocks = [f"transformer.h.{i}" for i in range(LAYERS)]
    assert features.layers == blocks and features.representations == ["prompt_last", "target_mean"]
    model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()
    batch = project["train"]
    with torch.no_grad():
        hidden = model(**{k: batch[k] for k in ("input_ids", "attention_mask")}, output_hidden_states=True)
    h = hidden.hidden_states[1]  # block 0's output (the last entry has ln_f applied)
    labels = batch["labels"].numpy()
    first = np.argmax(labels != -100, axis=1)
    rows = np.arange(len(labels))
    np.testing.assert_allclose(
        features.array("train", blocks[0], "prompt_last"), h[rows, first - 1].numpy(), rtol=1e-4, atol=1e-5
    )
    target = torch.as_tensor(labels != -100, dtype=h.dtype)[:, :, None]
    mean = (h * target).sum(1) / target.sum(1)
    np.testing.assert_allclose(
        features.array("train", blocks[0], "target_mean"), mean.numpy(), rtol=1e-4, atol=1e-5
    )
    assert features.array("test", blocks[1], "target_mean").shape == (len(project["test"]["input_ids"]), 32)


@pytest.mark.quality
def test_probes_tell_the_prompt_groups_apart_per_layer(lm_run):
    _, paths = lm_run
    table = pd.read_csv(paths.table("probes", "prompts"))
    group = table[(table["target"] == "group") & (table["eval_split"] == "test")]
    assert set(group["layer"]) == {f"transformer.h.{i}" for i in range(LAYERS)}
    assert set(group["representation"]) == {"prompt_last", "target_mean"}
    assert set(group["epoch"]) == set(STEPS)
    # the four prompt templates differ in their words: each block's states tell them apart (chance
    # 0.25; 0.62-0.85 for the worst of the 8 probes over the measured draws, threads and kernels);
    # 24 of 48 test prompts right is p < 0.001 against chance for all 8 probes together
    assert (group["chance"] == 0.25).all() and (group["status"] == "ok").all()
    at_least(
        "probe accuracy of the prompt group, worst layer x representation x step",
        group["accuracy_mean"].min(),
        0.5,
        group[["layer", "representation", "epoch", "accuracy_mean"]],
    )
    # curvature bins are a training-only target, evaluated on a training holdout: this data has none,
    # which the table says (no silent gap)
    curvature = table[table["target"] == "curvature_q4"]
    assert len(curvature) == 2 * LAYERS * len(STEPS) and curvature["accuracy_mean"].isna().all()
    assert curvature["status"].str.startswith("skipped: the data has no training holdout").all()
    assert Path(paths.figure("probe_accuracy", "png", "prompts")).stat().st_size > 10_000


def tracked_gradients(model, batch: dict, layers: list[str]) -> np.ndarray:
    """Per-sample gradients (N, P) of transformers' own loss of each sample alone, with respect
    to the weights and biases of ``layers``. A head tied to the input embedding is untied first: the
    influence engine tracks the head's own use of the weight, not the embedding's."""
    head = model.get_output_embeddings()
    if head.weight is model.get_input_embeddings().weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
    modules = dict(model.named_modules())
    params = [p for name in layers for p in (modules[name].weight, modules[name].bias) if p is not None]
    grads = []
    for i in range(len(batch["input_ids"])):
        loss = model(**{k: v[i : i + 1] for k, v in batch.items()}).loss
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double())
    return torch.stack(grads).numpy()


def check_influence(project: dict, paths: Layout, step: int) -> dict:
    """Influence at ``step`` against transformers' own per-sample loss and gradients: the scores'
    losses, and the gradient dot products (identity) of every query with every training sample."""
    from transformers import AutoModelForCausalLM

    n, q = len(project["train"]["input_ids"]), len(project["test"]["input_ids"])
    scores = {
        m: np.load(paths.influence_file("scores.npz", "prompts", 0, step, m)) for m in ("ekfac", "identity")
    }
    for m, s in scores.items():
        assert s["self_influence"].shape == (n,) and np.isfinite(s["self_influence"]).all(), m
        assert s["pairwise_none"].shape == (q, n) and np.isfinite(s["pairwise_none"]).all(), m
        np.testing.assert_array_equal(s["query_test_indices"], np.arange(q))
    model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()
    loss, _ = per_sample_loss(model, project["train"])
    np.testing.assert_allclose(scores["ekfac"]["loss"], loss, rtol=1e-5)
    diagnostics = pd.read_csv(paths.influence_file("diagnostics.csv", "prompts", 0, step, "identity"))
    layers = diagnostics["layer"].tolist()
    g_train = tracked_gradients(model, project["train"], layers)
    g_test = tracked_gradients(model, project["test"], layers)
    np.testing.assert_allclose(scores["identity"]["self_influence"], (g_train**2).sum(1), rtol=2e-4)
    pair = g_test @ g_train.T
    np.testing.assert_allclose(
        scores["identity"]["pairwise_none"], pair, rtol=2e-3, atol=2e-4 * np.abs(pair).max()
    )
    assert (scores["ekfac"]["self_influence"] > 0).all()
    return {"scores": scores, "layers": layers}


@pytest.mark.quality
def test_influence_equals_transformers_own_gradients_and_finds_the_users_poisons(lm_run):
    project, paths = lm_run
    got = check_influence(project, paths, STEPS[-1])
    assert any(name.endswith("attn.c_attn") for name in got["layers"])  # GPT-2's Conv1D, tracked
    assert "lm_head" in got["layers"]  # the head tied to the embedding: its own use of the weight
    detection = pd.read_csv(paths.table("poison_detection", "prompts")).set_index(["method", "signal"])
    auroc = detection["auroc"]
    assert auroc.notna().all() and (detection["status"] == "ok").all(), detection
    # a wrong capital raises the loss of the test facts about its land: query influence ranks them
    # above chance (0.70-0.97 over the measured draws, threads and kernels; 8 poisons are few, so
    # chance itself reaches 0.67 one time in twenty: docs/tutorials/causal-lm-heads.md)
    above("EK-FAC query influence AUROC of the poisons", auroc[("ekfac", "query_influence")], 0.5, auroc)
    below("random AUROC of the poisons", auroc[("random", "random")], 0.7, auroc)
    top = pd.read_csv(paths.table("influence_top_ranked", "prompts"))
    assert set(top["label"]) == {0}  # a language model's samples have no class
    assert Path(paths.figure("poison_roc", "png", "prompts")).stat().st_size > 10_000


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """A tiny Llama with grouped-query attention, trained by the Trainer: evaluation and influence
    (a causal LM's dossier is the GPT-2 run's)."""
    root = tmp_path_factory.mktemp("llama")
    project = write_project(root / "project", "llama", steps=(40, 80))
    wf = copy_workflow(root / "wf")
    work = root / "work"
    work.mkdir()
    config = user_config(project)
    run = config["runs"]["prompts"]
    for stage in ("curvature", "features", "probes", "ablation", "samples"):
        run[stage] = {"enabled": False}
    snakemake(wf, work, configfile=write_config(root / "config.yaml", config))
    return project, Layout(work / "results")


def test_grouped_query_attention_llama_evaluation_and_influence(llama_run):
    from transformers import AutoModelForCausalLM

    project, paths = llama_run
    step = project["steps"][-1]
    model = AutoModelForCausalLM.from_pretrained(project["runs"] / f"checkpoint-{step}").eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    groups = pd.read_csv(paths.table("accuracy_per_group", "prompts"))
    rows = groups[(groups["epoch"] == step) & (groups["split"] == "test")].set_index("data_group")
    loss, exact = per_sample_loss(model, project["test"])
    names = project["test_table"]["group"].to_numpy()
    for g in GROUPS:
        np.testing.assert_allclose(rows.loc[g, "mean_loss"], loss[names == g].mean(), rtol=1e-5)
        assert rows.loc[g, "n_correct"] == exact[names == g].sum(), g
    got = check_influence(project, paths, step)
    spectrum = pd.read_csv(paths.influence_file("factor_diagnostics.csv", "prompts", 0, step, "ekfac"))
    out_dim = spectrum.set_index("layer")["out_dim"]
    # one key/value head of 16 for two query heads of 16: k and v project to 16, q to 32
    assert out_dim["model.layers.0.self_attn.k_proj"] == 16 == out_dim["model.layers.0.self_attn.v_proj"]
    assert out_dim["model.layers.0.self_attn.q_proj"] == 32
    assert "model.layers.1.self_attn.k_proj" in got["layers"]
