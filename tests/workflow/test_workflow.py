"""The workflow as users drive it: job lists, partial rebuilds, staleness, and bad input.

The tiny run (wfutil.tiny_run) reads its checkpoints from a folder, as a user with their own
training run would: digits, 10 classes, 4 initial +3 every 2 epochs -> checkpoints at 0, 2, 4, 6.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from dossier_checks import check_summaries, check_training_rows
from dossier_checks import read as read_dossier
from wfutil import (
    REPO,
    TINY_EPOCHS,
    analysed_at,
    job_stats,
    planned_jobs,
    planned_wildcards,
    save_random_checkpoint,
    snakemake,
    tiny_config,
    tiny_run,
    write_config,
)

from epochlens.layout import RESULTS, Layout
from epochlens.models.networks import ResNet18LoP, SmallCNN

pytestmark = pytest.mark.workflow

EPOCHS = TINY_EPOCHS
# What one changed checkpoint reruns: its epoch's evaluation, curvature, features, probes and
# ablations, its index's sample outputs, then the aggregates.
OFF = {"enabled": False}
ONE_EPOCH_AND_AGGREGATES = {
    "evaluate_checkpoint": 1,
    "sample_outputs_shard": 1,
    "sample_outputs": 1,
    "sample_dossier": 1,
    "plot_data_map": 1,
    "sample_explorer": 1,
    "curvature_shard": 1,
    "curvature_epoch": 1,
    "features_epoch": 1,
    "probes_epoch": 1,
    "ablation_epoch": 1,
    "curvature_tables": 1,
    "plot_curvature": 1,
    "accuracy_tables": 1,
    "plot_accuracy": 1,
    "probe_tables": 1,
    "plot_probes": 1,
    "ablation_tables": 1,
    "plot_ablation": 1,
    "all": 1,
}


@pytest.fixture
def tiny(tmp_path):
    """(workflow copy, workdir, configfile, checkpoint folder), nothing run yet."""
    return tiny_run(tmp_path, run=False)


@pytest.fixture(scope="module")
def tiny_done(tmp_path_factory):
    """One finished tiny run for this module (each full run takes minutes here).
    test_results_of_tiny_run reads it; test_partial_rebuilds then edits and reruns it, which
    changes none of what the former checks (class counts and cohort sizes), whatever the order.
    Features, probes and ablations at the epochs test_partial_rebuilds touches and the last."""
    return tiny_run(tmp_path_factory.mktemp("tiny_done"), partial_config)


def partial_config(ckpts) -> dict:
    return tiny_config(ckpts, **analysed_at(4, 6))


def test_default_config_job_list(tmp_path):
    jobs = planned_jobs(REPO, tmp_path, configfile=REPO / "config/config.yaml")
    # digits, 2 seeds, 5 tasks x 15 epochs, checkpoints every 3 epochs -> 26 per seed; digits_noisy
    # (10% flipped labels), 2 seeds, checkpoints at the 6 task boundaries, influence of seed 0 at
    # epoch 75; polarity (a transformer, a trigger word in 10% of the negative sentences), 1 seed,
    # checkpoints 0, 5, 10, influence at 10; digits and digits_noisy compared
    assert jobs == {
        "prepare_data": 3,
        "class_order": 5,
        "train_digits": 2,
        "train_digits_noisy": 2,
        "train_polarity": 1,
        "evaluate_checkpoint": 52 + 12 + 3,
        "curvature_shard": 52 + 3,  # every checkpoint x 2 seeds x 1 shard; polarity's 3
        "curvature_epoch": 52 + 3,
        "curvature_tables": 2,
        "plot_curvature": 2,
        "features_epoch": 10 + 3,  # task boundaries 15..75 x 2 seeds; polarity: every checkpoint
        "probes_epoch": 10 + 3,
        "probe_tables": 2,
        "plot_probes": 2,
        "ablation_epoch": 10 + 2,  # polarity: heads at epochs 5 and 10
        "ablation_tables": 2,
        "plot_ablation": 2,
        "influence_factors": 3 + 2,  # ekfac, kfac, diagonal; polarity: ekfac, kfac
        "influence_scores": 5 + 3,  # and identity, tracin; polarity: and identity
        "influence_store_shard": 1,  # digits_noisy: logra's store (influence.shards: 1)
        "influence_store_eigen": 1,
        "influence_store_scores": 1,
        "poison_detection": 2,
        "plot_influence": 2,
        "lds_retrain": 2,  # 16 retrainings in 2 jobs
        "lds_tables": 1,
        "plot_lds": 1,
        "accuracy_tables": 3,
        "plot_accuracy": 3,
        "plot_training": 3,
        "comparison_tables": 1,
        "plot_comparisons": 1,
        "sample_outputs_shard": 2 + 2 + 1,  # one per index of every run (samples.shards: 1)
        "sample_outputs": 2 + 2 + 1,  # its merge
        "sample_dossier": 3,
        "sample_thumbnails": 2,  # digits and digits_noisy: images (polarity: texts)
        "plot_data_map": 3,
        "sample_explorer": 3,  # one explorer per dossier
        "all": 1,
    }


def test_results_of_tiny_run(tiny_done):
    work = tiny_done.work
    per_class = pd.read_csv(work / RESULTS.table("accuracy_per_class", "tiny"))
    test = per_class[per_class["split"] == "test"]
    # Classes evaluated per checkpoint follow the schedule: 4, 4, 7, 10.
    assert test.groupby("epoch")["class_id"].nunique().to_dict() == {0: 4, 2: 4, 4: 7, 6: 10}
    order = np.load(work / RESULTS.class_order("tiny", 0))
    assert sorted(test[test["epoch"] == 2]["class_id"]) == sorted(order[:4])
    cohorts = pd.read_csv(work / RESULTS.table("accuracy_per_cohort", "tiny"))
    at6 = cohorts[(cohorts["epoch"] == 6) & (cohorts["split"] == "test")].set_index("group")
    assert set(at6.index) == {"cohort 0", "cohort 1", "cohort 2", "old", "new"}
    assert at6.loc["new", "n"] == at6.loc["cohort 2", "n"]
    assert at6.loc["old", "n"] == at6.loc["cohort 0", "n"] + at6.loc["cohort 1", "n"]


def test_the_dossier_is_the_curvature_and_dynamics_of_the_run(tiny_done):
    """The tiny run's dossier (no influence, no ground truth): its curvature series are the
    per-image arrays of every epoch, and its learning time, forgetting events, CSL and curvature
    summaries those of tables/sample_dynamics.csv, computed there from the curvature stage's own
    loss and correctness (here from the dossier's forward passes)."""
    paths = Layout(tiny_done.work / "results")
    rows = check_training_rows(paths, "tiny", 0)  # no ground truth: no is_corrupted column
    check_summaries(rows)
    dossier, meta = read_dossier(paths, "tiny")
    assert meta["influence_methods"] == [] and not any(c.startswith("self_influence") for c in dossier)
    assert meta["detectors"] == ["loss", "aum"]
    for k, epoch in enumerate(EPOCHS):
        for key in ("curvature", "grad_norm"):
            array = np.load(paths.curvature_array(key, "tiny", 0, epoch))
            np.testing.assert_array_equal(np.stack(rows[key].to_numpy())[:, k], array, err_msg=key)
    dynamics = pd.read_csv(paths.table("sample_dynamics", "tiny"))
    dynamics = dynamics[dynamics["index"] == 0].sort_values("sample")
    for column in ("learning_time", "forgetting_events"):
        np.testing.assert_array_equal(rows[column].to_numpy(float), dynamics[column].to_numpy(float), column)
    for column in ("csl", "curvature_mean", "curvature_max"):
        np.testing.assert_allclose(rows[column], dynamics[column], rtol=1e-5, err_msg=column)
    assert (tiny_done.work / RESULTS.figure("data_map", "png", "tiny")).stat().st_size > 10_000


def test_partial_rebuilds(tiny, tiny_done):
    # One epoch's output builds only what that epoch needs (planned on a run not yet started).
    one = RESULTS.eval_table("tiny", 0, 4)
    assert planned_jobs(tiny.wf, tiny.work, one, configfile=tiny.cfg) == {
        "prepare_data": 1,
        "class_order": 1,
        "evaluate_checkpoint": 1,
    }

    # The finished run (the module's shared one).
    wf, work, cfg, ckpts = tiny_done
    assert (work / RESULTS.figure("accuracy_by_cohort", "png", "tiny")).stat().st_size > 10_000
    assert (work / RESULTS.figure("accuracy_by_cohort", "pdf", "tiny")).exists()

    # A second run does nothing.
    assert planned_jobs(wf, work, configfile=cfg) == {}

    # Replacing one checkpoint reruns that epoch (evaluation, curvature, features, probes,
    # ablations) and the aggregates only.
    save_random_checkpoint(SmallCNN, ckpts / "index-0_epoch-4.pt", seed=99, num_classes=10)
    plan = snakemake(wf, work, "--dry-run", configfile=cfg).stdout
    assert job_stats(plan) == ONE_EPOCH_AND_AGGREGATES
    assert planned_wildcards(plan, "evaluate_checkpoint") == ["run=tiny, index=0, epoch=0004"]
    assert planned_wildcards(plan, "curvature_shard") == ["run=tiny, index=0, epoch=0004, shard=0, nshards=1"]
    # (what it plans is the claim; computing it is tests/workflow/test_features_workflow.py's
    # test_what_reruns: here the results are marked up to date, as `--touch` does for a user)
    snakemake(wf, work, "--touch", configfile=cfg)

    # Editing a plotting script reruns plots only (also through the `figures` target).
    with open(wf / "scripts/plot_accuracy.py", "a") as f:
        f.write("\n# edited\n")
    assert planned_jobs(wf, work, "figures", configfile=cfg) == {"plot_accuracy": 1, "figures": 1}
    with open(wf / "scripts/plot_curvature.py", "a") as f:
        f.write("\n# edited\n")
    assert planned_jobs(wf, work, "figures", configfile=cfg) == {
        "plot_accuracy": 1,
        "plot_curvature": 1,
        "figures": 1,
    }
    snakemake(wf, work, configfile=cfg)

    # Editing a library module a rule imports reruns that rule (and what depends on it).
    with open(wf / "src/epochlens/evaluation.py", "a") as f:
        f.write("\n# edited\n")
    assert planned_jobs(wf, work, configfile=cfg) == {
        "evaluate_checkpoint": len(EPOCHS),
        "accuracy_tables": 1,
        "plot_accuracy": 1,
        "all": 1,
    }


def test_config_typo_fails_before_any_job(tiny):
    wf, work, _, ckpts = tiny
    cfg = tiny_config(ckpts)
    cfg["runs"]["tiny"]["schedule"]["epoch_per_task"] = cfg["runs"]["tiny"]["schedule"].pop("epochs_per_task")
    path = write_config(work / "typo.yaml", cfg)
    proc = snakemake(wf, work, "--dry-run", configfile=path, check=False)
    assert proc.returncode != 0
    assert "runs.tiny.schedule" in proc.stdout
    assert "'epoch_per_task' was unexpected" in proc.stdout
    assert "allowed keys here: epochs_per_task, increment, initial_classes" in proc.stdout
    assert not (work / "results").exists()


def test_bad_config_value_names_key_and_allowed_values(tiny):
    wf, work, _, ckpts = tiny
    cfg = tiny_config(ckpts, model={"name": "resnet50"})
    proc = snakemake(wf, work, "--dry-run", configfile=write_config(work / "bad.yaml", cfg), check=False)
    assert proc.returncode != 0
    assert "runs.tiny.model.name" in proc.stdout
    assert "allowed values: small_cnn, resnet18_lop" in proc.stdout


def test_missing_checkpoints_are_listed_at_once(tiny):
    """One dry run names every missing checkpoint with the fix. Without --keep-going that is the
    error and nothing runs; with it, each missing checkpoint is a job that will fail alone."""
    wf, work, cfg, ckpts = tiny
    gone = [ckpts / "index-0_epoch-2.pt", ckpts / "index-0_epoch-6.pt"]
    for path in gone:
        path.unlink()
    proc = snakemake(wf, work, "--dry-run", configfile=cfg, check=False, keep_going=False)
    assert proc.returncode != 0
    assert "2 checkpoint(s) that the config needs are missing (run tiny: 2 of 4)" in proc.stdout
    for path, epoch in zip(gone, (2, 6), strict=True):
        assert f"{path}  (run tiny, index 0, epoch {epoch})" in proc.stdout
    assert "Nothing was run" in proc.stdout and "correct checkpoints.path of runs.tiny" in proc.stdout
    assert not (work / "results").exists()

    proc = snakemake(wf, work, "--dry-run", configfile=cfg)
    assert proc.stdout.count("checkpoint(s) that the config needs are missing") == 1  # once
    assert all(str(path) in proc.stdout for path in gone)
    jobs = job_stats(proc.stdout)
    assert jobs["missing_checkpoint"] == 2 and jobs["evaluate_checkpoint"] == 4
    assert sorted(planned_wildcards(proc.stdout, "missing_checkpoint")) == [
        "run=tiny, index=0, epoch=0002",
        "run=tiny, index=0, epoch=0006",
    ]


@pytest.mark.slow
def test_with_keep_going_the_missing_checkpoints_fail_alone(tmp_path):
    """The epochs that have their checkpoints are evaluated; each missing one fails with the fix;
    once the file is there, the next run computes only what is missing."""
    config = lambda ckpts: tiny_config(ckpts, curvature=OFF, features=OFF, probes=OFF, ablation=OFF)  # noqa: E731
    wf, work, cfg, ckpts = tiny_run(tmp_path, config, run=False)
    gone = ckpts / "index-0_epoch-4.pt"
    content = gone.read_bytes()
    gone.unlink()
    proc = snakemake(wf, work, configfile=cfg, check=False)
    assert proc.returncode != 0
    assert f"{gone}: checkpoint not found (run tiny, index 0, epoch 4)" in proc.stdout
    evals = (work / RESULTS.eval_table("tiny", 0, 0)).parent
    assert sorted(p.name for p in evals.glob("*.csv")) == [
        "epoch_0000.csv",
        "epoch_0002.csv",
        "epoch_0006.csv",
    ]
    assert not (work / RESULTS.table("accuracy_per_class", "tiny")).exists()  # waits for epoch 4
    log = work / RESULTS.log("missing_checkpoint", "tiny", 0, 4)
    assert "correct runs.tiny.checkpoints.path" in log.read_text()
    gone.write_bytes(content)
    assert planned_jobs(wf, work, configfile=cfg) == {
        "evaluate_checkpoint": 1,
        "accuracy_tables": 1,
        "plot_accuracy": 1,
        "sample_outputs_shard": 1,  # every checkpoint of the index (it failed without epoch 4's)
        "sample_outputs": 1,
        "sample_dossier": 1,
        "plot_data_map": 1,
        "sample_explorer": 1,
        "all": 1,
    }


def test_corrupt_checkpoint_fails_its_epoch_and_keeps_the_rest(tiny):
    """Evaluation and curvature at every epoch (the other per-epoch stages fail and keep alike)."""
    wf, work, _, ckpts = tiny
    config = tiny_config(ckpts, features=OFF, probes=OFF, ablation=OFF, samples=OFF)
    cfg = write_config(work / "corrupt.yaml", config)
    bad = ckpts / "index-0_epoch-2.pt"
    bad.write_bytes(bad.read_bytes()[:1000])
    proc = snakemake(wf, work, configfile=cfg, check=False)
    assert proc.returncode != 0
    assert str(bad) in proc.stdout
    assert "truncated or corrupt" in proc.stdout
    evals = (work / RESULTS.eval_table("tiny", 0, 0)).parent
    assert sorted(p.name for p in evals.glob("*.csv")) == [
        "epoch_0000.csv",
        "epoch_0004.csv",
        "epoch_0006.csv",
    ]  # the files users have on disk
    # Fixing the file and rerunning computes only what is missing.
    save_random_checkpoint(SmallCNN, bad, seed=2, num_classes=10)
    evaluation = {"evaluate_checkpoint": 1, "accuracy_tables": 1, "plot_accuracy": 1, "all": 1}
    curvature = {"curvature_shard": 1, "curvature_epoch": 1, "curvature_tables": 1, "plot_curvature": 1}
    assert planned_jobs(wf, work, configfile=cfg) == evaluation | curvature


def test_checkpoint_of_another_architecture_lists_keys(tiny):
    wf, work, cfg, ckpts = tiny
    save_random_checkpoint(ResNet18LoP, ckpts / "index-0_epoch-0.pt", seed=0, num_classes=10)
    proc = snakemake(wf, work, RESULTS.eval_table("tiny", 0, 0), configfile=cfg, check=False)
    assert proc.returncode != 0
    assert "does not fit model SmallCNN" in proc.stdout
    assert "unexpected keys ['bn1.bias'" in proc.stdout


def test_class_order_that_is_not_a_permutation(tiny, tmp_path):
    wf, work, _, ckpts = tiny
    order_file = tmp_path / "class_order" / "index-0.npy"
    order_file.parent.mkdir()
    np.save(order_file, np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 8]))
    cfg = tiny_config(
        ckpts, class_order={"source": "file", "path": str(tmp_path / "class_order/index-{index}.npy")}
    )
    path = write_config(work / "order.yaml", cfg)
    proc = snakemake(wf, work, RESULTS.class_order("tiny", 0), configfile=path, check=False)
    assert proc.returncode != 0
    assert str(order_file) in proc.stdout
    assert "not a permutation" in proc.stdout and "repeated [8]" in proc.stdout


def test_data_folder_in_the_wrong_layout(tiny, tmp_path):
    wf, work, _, ckpts = tiny
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "img_0.png").write_bytes(b"\x89PNG")
    cfg = tiny_config(ckpts, data={"source": "cifar100", "path": str(folder)})
    path = write_config(work / "layout.yaml", cfg)
    proc = snakemake(wf, work, "--dry-run", RESULTS.dataset("tiny"), configfile=path, check=False)
    assert proc.returncode != 0
    assert f"{folder}: not a cifar-100-python folder" in proc.stdout
    assert "found ['img_0.png']" in proc.stdout


def test_ablation_in_parts_makes_the_same_table(tiny_done, tmp_path):
    """ablation.parts: 3 splits a checkpoint's units over three jobs; its table, merged from
    theirs, is the one job's byte for byte (a copy of the finished run: the others keep theirs)."""
    wf, work, cfg, _ = tiny_done
    copy = shutil.copytree(work, tmp_path / "work", symlinks=True)  # times kept: nothing else reruns
    spec = yaml.safe_load(cfg.read_text())
    spec["runs"]["tiny"]["ablation"]["parts"] = 3
    parts = write_config(tmp_path / "parts.yaml", spec)
    table = RESULTS.ablation_table("tiny", 0, 6)
    whole = (copy / table).read_bytes()
    assert planned_jobs(wf, copy, table, configfile=parts) == {"ablation_part": 3, "ablation_epoch": 1}
    snakemake(wf, copy, table, configfile=parts)
    assert (copy / table).read_bytes() == whole
    assert len(list((copy / table.removesuffix(".csv")).glob("part_*-of-3.csv"))) == 3
