"""Influence and the data-quality study in the workflow: job lists, the detection table and figures
of a tiny trained run with flipped labels, and what a config change reruns.

The tiny run (wfutil.tiny_config: digits, 4 initial classes +3 every 2 epochs), trained by the
pipeline (6 epochs, seconds) on data with 10% of the training labels flipped, influence at the last
checkpoint (epoch 6) by EK-FAC, identity, TracIn (epochs 2, 4, 6) and LoGra (the projected
gradient store).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from dossier_checks import check_detectors, check_influence, check_summaries, check_training_rows
from dossier_checks import read as read_dossier
from quality import SEED, above
from wfutil import copy_workflow, planned_jobs, snakemake, tiny_config, write_config
from wfutil import tiny_run as make_tiny_run

from epochlens.data import holdout_mask, load_digits, read_dataset
from epochlens.layout import RESULTS, Layout
from epochlens.provenance import file_sha256
from epochlens.study.detection import DETECTION_COLUMNS

pytestmark = pytest.mark.workflow

OFF = {"enabled": False}
METHODS = ["ekfac", "identity", "tracin", "logra"]
# The linear datamodeling score of the tiny run: 3 retrainings (seconds each) in 2 jobs.
LDS = {"enabled": True, "subsets": 3, "parts": 2, "bootstrap": 20}


def influence_config(tmp_path, influence=None, corruption=None, **run) -> dict:
    """The tiny run trained by the pipeline, other analyses off, influence on."""
    cfg = tiny_config(tmp_path / "unused", **run)
    spec = cfg["runs"]["tiny"]
    spec["checkpoints"] = {"source": "train"}
    spec["train"] = {"lr": 0.02, "early_stopping": False, "seed": SEED}
    spec["data"]["corruption"] = corruption or {"kind": "label_flip", "fraction": 0.1, "seed": 0}
    spec.update(curvature=OFF, features=OFF, probes=OFF, ablation=OFF)
    spec["influence"] = {
        "enabled": True,
        "methods": METHODS,
        "queries": {"max_count": 8},
        "transforms": ["none", "hflip"],
        "top_k": 6,
        **(influence or {}),
    }
    return cfg


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(workflow copy, workdir, config dict, configfile) after the tiny study's `influence` target
    (no evaluation, accuracy tables or their figures: not needed here). Its sample outputs in two
    shards: the dossier's test checks them against the evaluation and the influence job."""
    root = tmp_path_factory.mktemp("influence")
    cfg = influence_config(root, influence={"lds": LDS}, samples={"shards": 2})
    run = make_tiny_run(root, cfg, "influence", name="influence")
    return run.wf, run.work, cfg, run.cfg


def test_dry_run_job_counts(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    cfg = influence_config(
        tmp_path,
        influence={"epochs": [4, 6], "methods": ["ekfac", "kfac", "diagonal", "identity", "tracin"]},
        indices=[0, 1],
    )
    jobs = planned_jobs(wf, tmp_path, configfile=write_config(tmp_path / "all.yaml", cfg))
    assert jobs["influence_factors"] == 2 * 2 * 3  # indices x epochs x methods with factors
    assert jobs["influence_scores"] == 2 * 2 * 5
    assert jobs["poison_detection"] == 1 and jobs["plot_influence"] == 1
    assert jobs["train_tiny"] == 2

    # One method's scores need that checkpoint's factors only (and TracIn its checkpoints).
    one = RESULTS.influence_file("metadata.json", "tiny", 1, 4, "kfac")
    assert planned_jobs(wf, tmp_path, one, configfile=tmp_path / "all.yaml") == {
        "prepare_data": 1,
        "class_order": 1,
        "train_tiny": 1,
        "influence_factors": 1,
        "influence_scores": 1,
    }

    # influence.enabled: false (the default) plans no influence job.
    cfg["runs"]["tiny"]["influence"] = OFF
    jobs = planned_jobs(wf, tmp_path, configfile=write_config(tmp_path / "off.yaml", cfg))
    assert not {"influence_factors", "influence_scores", "poison_detection"} & set(jobs)


@pytest.mark.parametrize(
    ("influence", "corruption", "message"),
    [
        ({}, {"kind": "trigger", "target_class": 12}, "corruption.target_class: 12 is not a class"),
        (
            {"lds": LDS, "transforms": ["hflip"]},
            None,
            "influence.lds: it correlates the untransformed queries' scores; add none",
        ),
    ],
)
def test_config_errors_name_the_key(tmp_path, influence, corruption, message):
    """Through Snakemake, before any job; every other check: tests/unit/config (no Snakemake)."""
    wf = copy_workflow(tmp_path / "wf")
    cfg = influence_config(tmp_path, influence=influence, corruption=corruption)
    proc = snakemake(
        wf, tmp_path, "--dry-run", configfile=write_config(tmp_path / "c.yaml", cfg), check=False
    )
    assert proc.returncode != 0
    assert message in proc.stdout


def test_labels_flipped_outside_the_holdout(tiny_run):
    _, work, _, _ = tiny_run
    data = read_dataset(work / RESULTS.dataset("tiny"))
    corrupted = np.load(work / RESULTS.corrupted_indices("tiny"))
    clean = load_digits()
    clean_holdout = holdout_mask(clean.train_labels, 5)
    changed = np.flatnonzero(data.train_labels != clean.train_labels)
    np.testing.assert_array_equal(changed, corrupted)
    assert corrupted.dtype == np.int64
    assert len(corrupted) == round(0.1 * (~clean_holdout).sum())
    assert not data.holdout[corrupted].any()
    np.testing.assert_array_equal(data.train_images, clean.train_images)


@pytest.mark.quality
def test_detection_table_and_figures(tiny_run):
    _, work, _, _ = tiny_run
    table = pd.read_csv(work / RESULTS.table("poison_detection", "tiny"))
    assert tuple(table.columns) == DETECTION_COLUMNS
    rows = set(zip(table["method"], table["signal"], strict=True))
    signals = {"self_influence", "query_influence", "query_influence_hflip"}
    assert rows == {(m, s) for m in METHODS for s in signals} | {
        ("loss", "loss"),
        ("random", "random"),
    }
    assert (table["epoch"] == 6).all() and (table["index"] == 0).all()
    assert table["auroc"].between(0, 1).all() and table["precision_at_k"].between(0, 1).all()
    # Flipped labels are what a trained model finds hard: every self-influence beats chance.
    self_rows = table[table["signal"] == "self_influence"]
    above("worst self-influence AUROC of the flipped labels", self_rows["auroc"].min(), 0.7, table)

    agreement = pd.read_csv(work / RESULTS.table("influence_transform_agreement", "tiny"))
    assert set(agreement["method"]) == set(METHODS)
    assert set(zip(agreement["transform_a"], agreement["transform_b"], strict=True)) == {("none", "hflip")}
    assert agreement["spearman"].between(-1, 1).all()
    top = pd.read_csv(work / RESULTS.table("influence_top_ranked", "tiny"))
    assert top.groupby(["method", "signal"])["rank"].max().eq(6).all()
    conditioning = pd.read_csv(work / RESULTS.table("influence_conditioning", "tiny"))
    ekfac = conditioning[conditioning["method"] == "ekfac"]
    assert list(ekfac["layer"]) == ["block1.0", "block2.0", "block3.0", "fc"]
    assert (ekfac["cond"] >= 1).all() and (ekfac["damping"] > 0).all()
    for name in ("poison_roc", "top_influential_images", "influence_conditioning"):
        assert (work / RESULTS.figure(name, "png", "tiny")).stat().st_size > 10_000, name
        assert (work / RESULTS.figure(name, "pdf", "tiny")).exists()


def test_scores_files(tiny_run):
    _, work, _, _ = tiny_run
    data = read_dataset(work / RESULTS.dataset("tiny"))
    for method in METHODS:
        folder = work / RESULTS.influence_dir("tiny", 0, 6, method)
        with np.load(folder / "scores.npz") as npz:
            self_scores, pairwise = npz["self_influence"], npz["pairwise_none"]
            queries, true, labels = npz["query_test_indices"], npz["query_true_labels"], npz["query_labels"]
        n = len(data.train_labels)
        assert self_scores.shape == (n,) and pairwise.shape == (len(queries), n)
        assert np.isnan(self_scores[data.holdout]).all() and np.isfinite(self_scores[~data.holdout]).all()
        assert 0 < len(queries) <= 8
        np.testing.assert_array_equal(true, data.test_labels[queries])
        np.testing.assert_array_equal(labels, true)  # queries.labels: correct (the default)
        meta = json.loads((folder / "metadata.json").read_text())
        assert (
            meta["method"] == method and meta["epoch"] == 6 and meta["queries"]["select"] == "misclassified"
        )
        assert set(meta["provenance"]["inputs"]) >= {"dataset", "class_order", "checkpoint"}
    meta = json.loads((work / RESULTS.influence_file("metadata.json", "tiny", 0, 6, "tracin")).read_text())
    assert meta["tracin_epochs"] == [2, 4, 6]
    ekfac = json.loads((work / RESULTS.influence_file("metadata.json", "tiny", 0, 6, "ekfac")).read_text())
    assert "factors" in ekfac["provenance"]["inputs"]
    assert (work / RESULTS.influence_file("factors.pt", "tiny", 0, 6, "ekfac")).exists()
    assert not (work / RESULTS.influence_file("factors.pt", "tiny", 0, 6, "identity")).exists()
    logra = json.loads((work / RESULTS.influence_file("metadata.json", "tiny", 0, 6, "logra")).read_text())
    assert logra["settings"]["projection"] == {
        "dim": 32,
        "dtype": "float32",
        "precondition": "gauss_newton",
        "seed": 0,
    }
    assert set(logra["timings"]) == {"store", "curvature", "queries", "scores"}
    rows = np.load(work / RESULTS.influence_shard("store", "tiny", 0, 6, "logra", 0, 1, "npy"), mmap_mode="r")
    assert rows.shape == (len(data.train_labels[~data.holdout]), 9 * 16 + 32 * 32 + 32 * 32 + 10 * 32)


def test_what_config_changes_rerun(tiny_run):
    wf, work, cfg, path = tiny_run
    assert planned_jobs(wf, work, "influence", configfile=path) == {}
    spec = cfg["runs"]["tiny"]

    def planned(**changes):
        changed = json.loads(json.dumps(cfg))
        changed["runs"]["tiny"]["influence"].update(changes)
        return planned_jobs(
            wf, work, "influence", configfile=write_config(path.parent / "changed.yaml", changed)
        )

    # Batch sizes do not change results: nothing reruns.
    assert planned(factor_batch_size=7, train_batch_size=5, query_batch_size=3) == {}
    # Damping changes the scores of the methods that invert a curvature, not their factors.
    assert planned(damping=0.01) == {
        "influence_scores": 1,
        "influence_store_scores": 1,  # the store is not recomputed
        "poison_detection": 1,
        "plot_influence": 1,
        "lds_tables": 1,
        "plot_lds": 1,
        "influence": 1,
    }
    # How logra preconditions changes its scores, not its store; the projection changes both.
    rescored = {"poison_detection": 1, "plot_influence": 1, "lds_tables": 1, "plot_lds": 1, "influence": 1}
    curvature = {"influence_store_eigen": 1, "influence_store_scores": 1}  # eigendecomposed once a store
    assert planned(projection={"precondition": "ekfac"}) == {**curvature, **rescored}
    assert planned(projection={"dim": 16}) == {"influence_store_shard": 1, **curvature, **rescored}
    # LDS: the bootstrap changes its tables only; the subsets rerun the retrainings.
    assert planned(lds={**LDS, "bootstrap": 30}) == {"lds_tables": 1, "plot_lds": 1, "influence": 1}
    assert planned(lds={**LDS, "fraction": 0.4}) == {
        "lds_retrain": 2,
        "lds_tables": 1,
        "plot_lds": 1,
        "influence": 1,
    }
    # Warm-started retrainings (from the run's epoch-4 checkpoint) are other retrainings.
    assert planned(lds={**LDS, "start": "previous"}) == {
        "lds_retrain": 2,
        "lds_tables": 1,
        "plot_lds": 1,
        "influence": 1,
    }
    # How query influence is reduced over the queries changes the tables only.
    assert planned(queries={**spec["influence"]["queries"], "reduce": "mean"}) == {
        "poison_detection": 1,
        "plot_influence": 1,
        "influence": 1,
    }
    # Other corrupted data: new data set, so training and everything after it.
    changed = json.loads(json.dumps(cfg))
    changed["runs"]["tiny"]["data"]["corruption"]["fraction"] = 0.2
    jobs = planned_jobs(wf, work, "influence", configfile=write_config(path.parent / "corrupt.yaml", changed))
    assert jobs["prepare_data"] == 1 and jobs["train_tiny"] == 1
    assert jobs["influence_factors"] == 1 and jobs["influence_scores"] == 3
    assert (
        jobs["influence_store_shard"] == jobs["influence_store_eigen"] == jobs["influence_store_scores"] == 1
    )
    # Other queries rerun the scoring only: the store of the training gradients stays.
    more = planned(queries={**spec["influence"]["queries"], "max_count": 6})
    assert more["influence_store_scores"] == 1 and "influence_store_shard" not in more

    def planned_after_editing(module: str) -> dict:
        """The plan with ``src/epochlens/<module>`` edited; the file restored afterwards."""
        source = wf / "src/epochlens" / module
        original, stat = source.read_text(), source.stat()
        source.write_text(original + "\n# edited\n")
        try:
            return planned_jobs(wf, work, "influence", configfile=path)
        finally:
            source.write_text(original)
            os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    # Editing the scoring module reruns the scores and what reads them, not the factors.
    assert planned_after_editing("influence/scores.py") == {
        "influence_scores": 3,
        "influence_store_scores": 1,  # it shares the score files' format (study_scores)
        "poison_detection": 1,
        "plot_influence": 1,
        "lds_tables": 1,
        "plot_lds": 1,
        "influence": 1,
    }
    # Editing the projection reruns the projected method's store and scores only.
    assert planned_after_editing("influence/projection.py") == {
        "influence_store_shard": 1,
        "influence_store_eigen": 1,
        "influence_store_scores": 1,
        "poison_detection": 1,
        "plot_influence": 1,
        "lds_tables": 1,
        "plot_lds": 1,
        "influence": 1,
    }
    # Editing LDS's table maths reruns its tables, not the retrainings.
    assert planned_after_editing("study/lds.py") == {"lds_tables": 1, "plot_lds": 1, "influence": 1}


def test_lds_table_and_figure(tiny_run):
    _, work, _, _ = tiny_run
    table = pd.read_csv(work / RESULTS.table("lds", "tiny"))
    assert list(table["method"]) == [*METHODS, "random"]
    assert (table["epoch"] == 6).all() and (table["n_subsets"] == 3).all()
    assert (table["fraction"] == 0.5).all()
    assert table["lds"].between(-1, 1).all() and (table["ci_low"] <= table["ci_high"]).all()
    queries = pd.read_csv(work / RESULTS.table("lds_queries", "tiny"))
    assert set(queries["method"]) == set(table["method"])
    for part in range(2):
        with np.load(work / RESULTS.lds_part("tiny", 0, 6, part, 2)) as npz:
            assert npz["masks"].shape[0] == len(npz["subset_ids"]) == npz["log_probs"].shape[0]
    assert (work / RESULTS.figure("lds", "png", "tiny")).stat().st_size > 10_000
    assert (work / RESULTS.figure("lds", "pdf", "tiny")).exists()


def test_lds_retrainings_warm_started_from_the_previous_checkpoint(tiny_run, tmp_path):
    """influence.lds.start: previous, run in a copy of the finished study: the two retraining jobs
    start from the run's epoch-4 checkpoint (recorded in their provenance) and train epochs 5-6
    only; the subsets are the same, the retrained models not."""
    import shutil

    wf, work, cfg, path = tiny_run
    copy = tmp_path / "work"
    shutil.copytree(work, copy, symlinks=True)
    changed = json.loads(json.dumps(cfg))
    changed["runs"]["tiny"]["influence"]["lds"] = {**LDS, "start": "previous"}
    out = snakemake(wf, copy, "influence", configfile=write_config(tmp_path / "warm.yaml", changed)).stdout
    assert "from the run's epoch 4" in "".join(
        p.read_text() for p in (copy / "results").rglob("retrain_*.log")
    )
    assert "lds_retrain" in out
    checkpoint = copy / RESULTS.checkpoint("tiny", 0, 4)
    for part in range(2):
        with (
            np.load(work / RESULTS.lds_part("tiny", 0, 6, part, 2)) as cold,
            np.load(copy / RESULTS.lds_part("tiny", 0, 6, part, 2)) as warm,
        ):
            np.testing.assert_array_equal(cold["masks"], warm["masks"])
            assert not np.allclose(cold["log_probs"], warm["log_probs"])
            info = json.loads(str(warm["info"]))
        assert info["provenance"]["inputs"]["start_checkpoint"] == file_sha256(checkpoint)
    table = pd.read_csv(copy / RESULTS.table("lds", "tiny"))
    assert table["lds"].between(-1, 1).all() and (table["n_subsets"] == 3).all()


def test_the_dossier_is_the_runs_arrays_and_tables(tiny_run):
    """samples/dossier.parquet of the finished study (its sample outputs, dossier and data map
    only: seconds) equals, column by column, what it is built from; its correctness agrees with the
    evaluation's per-class accuracy and its last loss with the influence job's own."""
    wf, work, _, path = tiny_run
    paths = Layout(work / "results")
    targets = [RESULTS.dossier("tiny"), RESULTS.figure("data_map", "png", "tiny")]
    snakemake(wf, work, *targets, RESULTS.table("accuracy_per_class", "tiny"), configfile=path)
    rows = check_training_rows(paths, "tiny", 0)
    check_summaries(rows)
    dossier, meta = read_dossier(paths, "tiny")
    assert meta["task"] == "classification" and meta["epochs"] == [0, 2, 4, 6]
    check_influence(paths, "tiny", 0, 6, METHODS)
    check_detectors(rows, meta)
    assert {"curvature", "grad_norm", "curvature_mean", "text", "group"}.isdisjoint(dossier)  # not computed
    # The holdout's correctness per class and checkpoint is the evaluation's accuracy.
    per_class = pd.read_csv(paths.table("accuracy_per_class", "tiny"))
    holdout = rows[rows["split"] == "holdout"]
    correct = np.stack(holdout["correct"].to_numpy())
    for row in per_class[per_class["split"] == "holdout"].itertuples():
        mine = correct[(holdout["label"] == row.class_id).to_numpy(), meta["epochs"].index(row.epoch)]
        assert mine.mean() == pytest.approx(row.accuracy), row
    with np.load(paths.influence_file("scores.npz", "tiny", 0, 6, "ekfac")) as npz:
        influence_loss = npz["loss"]
    trained = np.isfinite(influence_loss)
    last = np.stack(rows["loss"].to_numpy())[:, -1]
    np.testing.assert_allclose(last[trained], influence_loss[trained], rtol=1e-4, atol=1e-6)
    # Queries: one row each, their outputs those of the test samples the scores name.
    queries = dossier[dossier["role"] == "query"]
    with np.load(paths.sample_outputs("tiny", 0)) as npz:
        test_loss = npz["test_loss"]
        assert "test_rows" not in npz.files  # the shards' rows are not in the merged file
    shards = sorted((work / RESULTS.sample_outputs("tiny", 0)).with_suffix("").iterdir())
    assert [p.name for p in shards] == ["shard_0-of-2.npz", "shard_1-of-2.npz"]
    tests = [int(i.split(":")[1]) for i in queries["id"]]
    np.testing.assert_array_equal(
        np.stack(queries["loss"].to_numpy()), test_loss[:, tests].T.astype(np.float32)
    )
    assert queries["is_corrupted"].isna().all() and queries["position"].tolist() == list(range(len(queries)))
    assert (work / RESULTS.figure("data_map", "png", "tiny")).stat().st_size > 10_000


def test_scores_too_large_to_keep_whole_give_the_same_tables_and_dossier(tiny_run, tmp_path):
    """influence.projection.pairwise_gb: 0 in a copy of the finished study: logra's scores.npz holds the
    store's summary (each sample's reductions over the queries, neighbours both ways) instead of the
    (Q, N) scores; only its scoring job and what reads it rerun (the store and its curvature stay),
    and the detection table and the dossier's logra columns are what the whole scores gave."""
    import shutil

    wf, work, cfg, path = tiny_run
    targets = [RESULTS.dossier("tiny"), RESULTS.table("poison_detection", "tiny")]
    snakemake(wf, work, *targets, configfile=path)  # nothing to do after the dossier's test
    copy = tmp_path / "work"
    shutil.copytree(work, copy, symlinks=True)
    changed = json.loads(json.dumps(cfg))
    changed["runs"]["tiny"]["influence"]["projection"] = {"pairwise_gb": 0}
    summary_cfg = write_config(tmp_path / "summary.yaml", changed)
    assert planned_jobs(wf, copy, *targets, configfile=summary_cfg) == {
        "influence_store_scores": 1, "poison_detection": 1, "sample_dossier": 1,
    }  # fmt: skip
    snakemake(wf, copy, *targets, configfile=summary_cfg)
    scores = RESULTS.influence_file("scores.npz", "tiny", 0, 6, "logra")
    with np.load(work / scores) as whole, np.load(copy / scores) as summary:
        assert "pairwise_none" in whole.files and not any(k.startswith("pairwise_") for k in summary.files)
        assert summary["proponents"].shape == (len(whole["self_influence"]), 8)  # k = min(10, 8 queries)
        np.testing.assert_array_equal(summary["self_influence"], whole["self_influence"])
    table = RESULTS.table("poison_detection", "tiny")
    before, after = (pd.read_csv(w / table).query("method == 'logra'") for w in (work, copy))
    pd.testing.assert_frame_equal(before, after, rtol=1e-9)
    (a, _), (b, _) = (
        read_dossier(Layout(work / "results"), "tiny"),
        read_dossier(Layout(copy / "results"), "tiny"),
    )
    logra = [c for c in a.columns if c.endswith("_logra")]
    assert {"query_influence_logra", "proponents_logra", "top_train_logra"} <= set(logra)
    for column in logra:
        x, y = a[column].to_numpy(), b[column].to_numpy()
        if x.dtype == object:  # lists of positions (equal) and of scores; None on the other role's rows
            x, y = ([np.asarray([] if v is None else v, float) for v in col] for col in (x, y))
            assert [len(v) for v in x] == [len(v) for v in y], column
            x, y = np.concatenate(x), np.concatenate(y)
        np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float), rtol=1e-9, err_msg=column)


def test_projected_stores_are_exact_where_nothing_is_projected(tiny_run, tmp_path):
    """tracin_rp and trak in a copy of the finished study, with projection dimensions above every
    layer's sides and the whole gradient's size (the identity). tracin_rp: a store at each of
    TracIn's checkpoints (epochs 2, 4, 6) and one scoring job summing over them, no curvature; its
    scores are the exact tracin's of the same run. trak without its preconditioner (precondition:
    none): its scores are identity's (gradient dot products)."""
    import shutil

    wf, work, cfg, _ = tiny_run
    copy = tmp_path / "work"
    shutil.copytree(work, copy, symlinks=True)
    changed = json.loads(json.dumps(cfg))
    spec = changed["runs"]["tiny"]["influence"]
    spec["methods"] = [*spec["methods"], "tracin_rp", "trak"]
    spec["projection"] = {"dim": 4096, "trak_dim": 10**7, "precondition": "none"}
    config = write_config(tmp_path / "stores.yaml", changed)
    targets = [RESULTS.influence_file("scores.npz", "tiny", 0, 6, m) for m in ("tracin_rp", "trak")]
    assert planned_jobs(wf, copy, *targets, configfile=config) == {
        "influence_store_shard": 4, "influence_store_eigen": 1, "influence_store_scores": 2,
    }  # fmt: skip
    snakemake(wf, copy, *targets, configfile=config)
    for method, exact in (("tracin_rp", "tracin"), ("trak", "identity")):
        exact = RESULTS.influence_file("scores.npz", "tiny", 0, 6, exact)
        with np.load(copy / RESULTS.influence_file("scores.npz", "tiny", 0, 6, method)) as ours:
            with np.load(work / exact) as theirs:
                for key in ("self_influence", "pairwise_none", "pairwise_hflip"):
                    scale = np.nanmax(np.abs(theirs[key]))
                    np.testing.assert_allclose(
                        ours[key], theirs[key], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{method} {key}"
                    )
                np.testing.assert_array_equal(ours["query_test_indices"], theirs["query_test_indices"])
    metadata = json.loads(
        (copy / RESULTS.influence_file("metadata.json", "tiny", 0, 6, "tracin_rp")).read_text()
    )
    assert metadata["tracin_epochs"] == [2, 4, 6] and metadata["pairwise"] == "full"
    metadata = json.loads((copy / RESULTS.influence_file("metadata.json", "tiny", 0, 6, "trak")).read_text())
    assert metadata["settings"]["projection"]["whole"] is True
