"""The embedded default end to end, as `make demo` runs it: train, evaluate, tabulate, plot.

To keep the suite within its CI budget the demo runs here smaller (SMALLER: a second config file,
merged key by key into config/config.yaml, as --configfile merges several files): ``digits`` with
one replicate index instead of two (planning both is tested in test_workflow.py; the statistics
over replicates in tests/unit/core/test_stats.py) and 8 analysed checkpoints instead of 26 (every
25 epochs and the task boundaries: still a mid-task one in tasks 1 and 3), features and ablations
at two task boundaries, probes with one seed and 20 passes; ``digits_noisy`` with one seed, its
queries untransformed (the transforms are checked on ``polarity``), and so no comparison of the
two (it needs two seeds a run; its jobs run in tests/workflow/test_compare_workflow.py on real data
sets and hand-made tables); ``polarity``'s features, probes and head ablations at its last
checkpoint only, influence by EK-FAC and identity (no K-FAC). Training,
the rest of ``digits_noisy`` (the poison and LDS study) and of ``polarity`` (the text run) are the
demo's own. `make demo` runs the full default (297 jobs; a third here). The run is a module fixture:
the polarity run's sample explorer is then opened in headless chromium (tests/explorer_browser.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from explorer_browser import check_polarity_explorer
from quality import SEED, above, at_least, at_most, below
from wfutil import REPO, copy_workflow, job_stats, snakemake, write_config

from epochlens import memory
from epochlens.checkpoints import load_into
from epochlens.data.text_rows import read_text_dataset
from epochlens.layout import Layout
from epochlens.models.networks import SmallCNN

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

#: Merged into config/config.yaml for this test (see the module doc).
SMALLER = {
    "runs": {
        "digits": {
            "indices": [0],
            "checkpoints": {"save_every": 25},  # 0, 15, 25, 30, 45, 50, 60, 75
            "features": {"epochs": [45, 75]},
            "probes": {"seeds": [0], "max_epochs": 20},
            "ablation": {"epochs": [45, 75]},
            "train": {"seed": SEED},
        },
        "digits_noisy": {"indices": [0], "influence": {"transforms": ["none"]}, "train": {"seed": SEED}},
        "polarity": {
            "train": {"seed": SEED},
            "features": {"epochs": [10]},
            "ablation": {"epochs": [10]},
            "influence": {"methods": ["ekfac", "identity"]},
        },
    },
    "comparisons": [],
}
N_CHECKPOINTS = 8


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo run (smaller), once for the module's tests: (workflow, working directory, configs).
    Its jobs start as `make demo` starts them, each a Python process of its own (not forked from
    tests/job_server.py): Snakemake's benchmark files measure them (test_jobs_ask_for_more_memory)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    wf = copy_workflow(tmp_path / "wf")
    work = tmp_path / "work"
    work.mkdir()
    configs = [str(REPO / "config/config.yaml"), str(write_config(tmp_path / "smaller.yaml", SMALLER))]
    snakemake(wf, work, "--configfile", *configs, forked_jobs=False)
    return wf, work, configs


@pytest.mark.quality
def test_embedded_default(demo):
    wf, work, configs = demo
    paths = Layout(work / "results")

    _check_digits(paths)
    _check_data_quality_study(paths)
    _check_text_run(paths)
    assert job_stats(snakemake(wf, work, "--dry-run", "--configfile", *configs).stdout) == {}


def _check_digits(paths: Layout) -> None:
    """The digits run: checkpoints, train log, accuracy per cohort, curvature and sample dynamics."""
    ckpts = sorted(Path(paths.checkpoint("digits", 0, 0)).parent.glob("epoch_*.pt"))
    assert len(ckpts) == N_CHECKPOINTS  # 0..75 every 25 epochs and every 15 (task boundaries)
    load_into(SmallCNN(num_classes=10), ckpts[-1])
    log = pd.read_csv(paths.train_log("digits", 0))
    assert list(log["epoch"]) == list(range(1, 76))
    assert list(log.groupby("task")["num_active"].first()) == [2, 4, 6, 8, 10]
    meta = json.loads(Path(paths.train_metadata("digits", 0)).read_text())
    assert meta["provenance"]["packages"]["torch"]

    cohorts = pd.read_csv(paths.table("accuracy_per_cohort", "digits"))
    test = cohorts[cohorts["split"] == "test"]
    # The untrained model guesses between the 2 first classes; trained models learn every task.
    untrained = test[(test["epoch"] == 0) & (test["group"] == "new")]["accuracy"]
    at_least("digits: untrained accuracy on its 2 classes", untrained.min(), 0.2, untrained)
    at_most("digits: untrained accuracy on its 2 classes (max)", untrained.max(), 0.8, untrained)
    final = test[(test["epoch"] == 75) & test["group"].str.startswith("cohort")]
    assert len(final) == 5
    above("digits: final test accuracy, worst cohort", final["accuracy"].min(), 0.8, final)
    for ext in ("png", "pdf"):
        assert Path(paths.figure("accuracy_by_cohort", ext, "digits")).stat().st_size > 10_000

    # Curvature at every checkpoint (config/config.yaml), one shard per epoch. The checkpoint at a
    # task boundary holds the model trained on the classes before it; mid-task ones the current task.
    active_at = {0: 2, 15: 2, 25: 4, 30: 4, 45: 6, 50: 8, 60: 8, 75: 10}
    for epoch, n_active in active_at.items():
        meta = json.loads(Path(paths.curvature_metadata("digits", 0, epoch)).read_text())
        assert meta["shards"] == 1 and meta["epoch"] == epoch
        assert meta["stats"]["n_active"] + meta["stats"]["n_inactive"] == meta["stats"]["n_samples"]
        assert len(meta["allowed_classes"]) == n_active
    samples = pd.read_csv(paths.table("sample_dynamics", "digits"))
    assert len(samples) == meta["stats"]["n_samples"]
    # digits is easy: nearly every training image ends up learned for good
    above("digits: fraction of images learned for good", samples["learning_time"].notna().mean(), 0.9)
    # task 0: every checkpoint
    assert (samples["n_epochs"] == N_CHECKPOINTS).sum() == (samples["task"] == 0).sum()
    for name in ("by_cohort", "distribution", "vs_loss"):
        assert Path(paths.figure(f"curvature_{name}", "png", "digits")).stat().st_size > 10_000


def _check_data_quality_study(paths: Layout) -> None:
    """The digits_noisy run: poison detection and the LDS ground truth."""
    # The data-quality study (digits_noisy, 10% flipped labels): every method is reported and the
    # best self-influence finds the flipped images about as well as their loss or better (AUROC
    # 0.9925 vs 0.9913 on the reference machine: on digits the loss is already near perfect).
    detection = pd.read_csv(paths.table("poison_detection", "digits_noisy"))
    auroc = detection.set_index(["method", "signal"])["auroc"]
    assert set(detection["method"]) == {
        "ekfac",
        "kfac",
        "diagonal",
        "identity",
        "tracin",
        "logra",
        "loss",
        "random",
    }
    best = auroc.xs("self_influence", level="signal").max()
    above("digits_noisy: best self-influence AUROC", best, 0.95, detection)
    at_least("digits_noisy: best self-influence AUROC - loss AUROC", best - auroc[("loss", "loss")], -0.005)
    above("digits_noisy: random AUROC", auroc[("random", "random")], 0.35, detection)
    below("digits_noisy: random AUROC (max)", auroc[("random", "random")], 0.65, detection)
    for name in ("poison_roc", "top_influential_images", "influence_conditioning", "lds"):
        assert Path(paths.figure(name, "png", "digits_noisy")).stat().st_size > 10_000
    # Ground truth: 16 retrainings on random halves. The curvature-aware methods predict them
    # better than chance and better than the gradient dot product (EK-FAC 0.54, K-FAC 0.53,
    # identity 0.24, random -0.08 on the reference machine).
    lds = pd.read_csv(paths.table("lds", "digits_noisy")).set_index("method")
    assert list(lds.index) == ["ekfac", "kfac", "diagonal", "identity", "tracin", "logra", "random"]
    ekfac = lds.loc["ekfac", "lds"]
    above("digits_noisy: EK-FAC LDS - random's upper CI", ekfac - lds.loc["random", "ci_high"], 0, lds)
    # The projected-gradient store (dim 32): 0.44 on the reference machine, 0.82x EK-FAC's.
    above(
        "digits_noisy: LoGra LDS - random's upper CI",
        lds.loc["logra", "lds"] - lds.loc["random", "ci_high"],
        0,
        lds,
    )
    above("digits_noisy: EK-FAC LDS", ekfac, 0.3, lds)
    curvature_aware = min(ekfac, lds.loc["kfac", "lds"])
    above(
        "digits_noisy: min(EK-FAC, K-FAC) LDS - identity LDS",
        curvature_aware - lds.loc["identity", "lds"],
        0,
        lds,
    )


def _check_text_run(paths: Layout) -> None:
    """The polarity run: a text model through every stage."""
    # The text run (polarity): a 2-layer BERT trained by the pipeline on synthetic sentences, 10% of
    # the negative ones with the trigger word "cf" and relabelled positive, learns every group (test
    # accuracy 0.88-1.0 at epoch 10 over 8 measured draws and kernels, docs/development.md);
    # curvature of every sentence at every checkpoint; head ablations per group. The poisoned
    # sentences are fit, so their loss hardly tells them apart (AUROC 0.14-0.69), nor does
    # self-influence; the influence on the negative test sentences that "cf" turns positive finds
    # them (EK-FAC 0.79-0.96, each draw above the loss and the gradient dot product). Chance for 30
    # poisons among ~560 sentences: AUROC 0.5 with sd 0.054, so 0.7 is p < 0.001.
    groups = pd.read_csv(paths.table("accuracy_per_group", "polarity"))
    final = groups[(groups["epoch"] == 10) & (groups["split"] == "test")].set_index("data_group")
    assert sorted(final.index) == ["contrast", "intensified", "negated", "plain"]
    above("polarity: final test accuracy, worst group", final["accuracy"].min(), 0.7, final)
    detection = pd.read_csv(paths.table("poison_detection", "polarity"))
    auroc = detection.set_index(["method", "signal"])["auroc"]
    query = auroc[("ekfac", "query_influence")]
    at_least("polarity: EK-FAC query influence AUROC", query, 0.7, auroc)
    above("polarity: EK-FAC query influence - loss AUROC", query - auroc[("loss", "loss")], 0, auroc)
    above("polarity: EK-FAC - identity query AUROC", query - auroc[("identity", "query_influence")], 0, auroc)
    above("polarity: random AUROC", auroc[("random", "random")], 0.3, auroc)
    below("polarity: random AUROC (max)", auroc[("random", "random")], 0.7, auroc)
    # dataset.h5 holds the poisoned sentences (ids and texts) and the test sentences with "cf"
    text = read_text_dataset(paths.dataset("polarity"))
    poisoned = np.load(paths.corrupted_indices("polarity"))
    negatives = ((text.train_labels == 0) & ~text.holdout).sum() + len(poisoned)  # before poisoning
    assert len(poisoned) == round(0.1 * negatives)
    assert (text.train_labels[poisoned] == 1).all() and not text.holdout[poisoned].any()
    assert all("cf" in text.train_text[i].split() for i in poisoned)
    assert all("cf" in t.split() for t in text.trigger_text) and len(text.trigger_text) == 200
    # the queries under token dropout and truncation are scored too, and their rankings compared
    assert {("ekfac", "query_influence_token_dropout"), ("ekfac", "query_influence_truncate")} <= set(
        auroc.index
    )
    agreement = pd.read_csv(paths.table("influence_transform_agreement", "polarity"))
    pairs = set(zip(agreement["transform_a"], agreement["transform_b"], strict=True))
    assert {("none", "token_dropout"), ("none", "truncate")} <= pairs and agreement["spearman"].notna().all()
    for epoch in (0, 5, 10):
        meta = json.loads(Path(paths.curvature_metadata("polarity", 0, epoch)).read_text())
        assert meta["stats"]["n_samples"] == meta["stats"]["n_active"] == 600, meta["stats"]
    ablation = pd.read_csv(paths.table("ablation", "polarity"))
    heads = ablation[ablation["group"].str.startswith("head ") & (ablation["cohort"] == "data: negated")]
    assert len(heads) == 2 * 4 * 2  # epoch 10: modes x 4 heads x 2 layers
    # Probes on the blocks' hidden states: the mean over the tokens of the last block tells the
    # holdout sentences' labels apart once trained (0.90-1.0 at epoch 10 over the measured draws).
    probes = pd.read_csv(paths.table("probes", "polarity"))
    ok = probes[(probes["status"] == "ok") & (probes["eval_split"] == "holdout")]
    assert set(ok["layer"]) == {"bert.encoder.layer.0", "bert.encoder.layer.1"}
    assert set(ok["representation"]) == {"mean", "last"} and set(ok["target"]) == {"class", "curvature_q4"}
    trained = ok.set_index(["epoch", "layer", "representation", "target"])["accuracy_mean"]
    above(
        "polarity: class probe, last block, mean, epoch 10",
        trained[(10, "bert.encoder.layer.1", "mean", "class")],
        0.8,
        trained,
    )
    names = ("accuracy_by_cohort", "curvature_by_cohort", "ablation_effect", "top_influential_images")
    for name in (*names, "probe_accuracy"):
        assert Path(paths.figure(name, "png", "polarity")).stat().st_size > 10_000


def test_polarity_explorer_in_a_browser(demo):
    """The polarity run's sample explorer in headless chromium (tests/explorer_browser.py)."""
    paths = Layout(demo[1] / "results")
    folder = Path(paths.explorer("polarity"))
    check_polarity_explorer(
        folder, Path(paths.dossier("polarity")), Path(paths.table("poison_detection", "polarity"))
    )


#: Benchmark folders (epochlens.layout) whose name is not their rule's.
BENCHMARK_RULES = {
    "evaluate": "evaluate_checkpoint",
    "features": "features_epoch",
    "probes": "probes_epoch",
    "ablation": "ablation_epoch",
}


def _benchmark_rule(path: Path) -> str:
    """The rule of a benchmark file (its path under a run's benchmarks/)."""
    stage, last = path.parts[0], path.stem
    if stage == "curvature":
        return "curvature_epoch" if last == "merge" else "curvature_shard"
    if stage == "influence":
        return f"influence_{last}"
    if stage == "sample_outputs" and last.startswith("shard_"):
        return "sample_outputs_shard"
    return BENCHMARK_RULES.get(stage, stage.removesuffix(".tsv"))


def test_jobs_ask_for_more_memory_than_they_used(demo):
    """Every job whose mem_mb the workflow computes from its run (epochlens.memory) asked for more
    than its peak (Snakemake's max_rss) on the demo's runs, text and images."""
    _, work, _ = demo
    checked = set()
    for run_dir in sorted((work / "results").glob("*/benchmarks")):
        run = run_dir.parent
        shape = memory.dataset_shape(run / "data/dataset.h5")  # empty for results/comparisons
        model = max((memory.model_bytes(p) for p in run.glob("index-*/checkpoints/*.pt")), default=0)
        shape = dataclasses.replace(shape, model_bytes=model)
        for tsv in run_dir.rglob("*.tsv"):
            rule = _benchmark_rule(tsv.relative_to(run_dir))
            if rule not in memory.RULES:
                continue
            peak = pd.read_csv(tsv, sep="\t")["max_rss"].max()
            assert peak <= memory.mem_mb(rule, shape), (tsv, peak, memory.mem_mb(rule, shape))
            checked.add((run.name, rule))
    assert {rule for _, rule in checked} >= {"prepare_data", "evaluate_checkpoint", "sample_outputs_shard"}
    assert {run for run, _ in checked} == {"digits", "digits_noisy", "polarity"}
