"""Features, probes and ablations in the workflow: job lists, outputs, cache behaviour, bad config.

The tiny run of test_workflow.py (digits, 4 initial classes +3 every 2 epochs, random checkpoints
at epochs 0, 2, 4, 6 read from a folder) with curvature at epochs 2 and 6 only, so that the
curvature target of the probes is skipped at epochs 0 and 4, and the cohort target (and the old
classes of the ablations) in the first task, epochs 0 and 2.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from wfutil import (
    TINY_EPOCHS,
    copy_workflow,
    job_stats,
    planned_jobs,
    planned_wildcards,
    save_random_checkpoint,
    snakemake,
    tiny_config,
    write_config,
)
from wfutil import tiny_run as make_tiny_run

from epochlens.data import read_dataset
from epochlens.features.cache import FeatureSet, load_or_extract
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.layout import RESULTS
from epochlens.models.networks import SmallCNN
from epochlens.provenance import file_sha256

pytestmark = pytest.mark.workflow

CURV_EPOCHS = (2, 6)
EPOCHS = TINY_EPOCHS
PER_EPOCH = {"features_epoch": 4, "probes_epoch": 4, "ablation_epoch": 4}
RUN_TABLES = {"probe_tables": 1, "plot_probes": 1, "ablation_tables": 1, "plot_ablation": 1}
PROBE_COLUMNS = [
    "run", "index", "epoch", "layer", "representation", "target", "seed", "eval_split",
    "n_features", "n_classes", "n_fit", "n_stop", "n_eval", "accuracy", "loss", "chance",
    "fit_accuracy", "best_epoch", "epochs_run", "status", "metric",
]  # fmt: skip
ABLATION_COLUMNS = [
    "run", "index", "epoch", "split", "block", "group", "channel_start", "channel_stop",
    "n_channels", "mode", "cohort", "n_samples", "accuracy_base", "accuracy", "delta_accuracy",
    "loss_base", "loss", "delta_loss",
]  # fmt: skip


def feature_config(ckpts, **sections) -> dict:
    """The tiny run with curvature at CURV_EPOCHS and cheap probes, without the sample dossier
    (tests/workflow/test_workflow.py has it); ``sections`` update the features / probes / ablation /
    curvature sections key by key."""
    base = {
        "curvature": {"epochs": list(CURV_EPOCHS)},
        "probes": {"seeds": [0, 1], "max_epochs": 40},
        "features": {},
        "ablation": {},
        "samples": {"enabled": False},
    }
    for name, values in sections.items():
        base[name] = {**base[name], **values}
    return tiny_config(ckpts, **base)


def touch_checkpoints(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for epoch in EPOCHS:
        (folder / f"index-0_epoch-{epoch}.pt").touch()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(workflow copy, workdir, configfile, checkpoint folder) after a whole run."""
    return tuple(make_tiny_run(tmp_path_factory.mktemp("features"), feature_config))


def test_dry_run_job_counts(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    ckpts = tmp_path / "model_parameters"
    touch_checkpoints(ckpts)
    cfg = write_config(tmp_path / "all.yaml", feature_config(ckpts))
    jobs = planned_jobs(wf, tmp_path, configfile=cfg)
    assert {rule: jobs[rule] for rule in {**PER_EPOCH, **RUN_TABLES}} == {**PER_EPOCH, **RUN_TABLES}

    # Each target builds its own stage and what it needs: features need no class order; probes
    # need the curvature of the epochs where it is computed.
    assert planned_jobs(wf, tmp_path, "features", configfile=cfg) == {
        "prepare_data": 1,
        "features_epoch": 4,
        "features": 1,
    }
    assert planned_jobs(wf, tmp_path, "probes", configfile=cfg) == {
        "prepare_data": 1,
        "class_order": 1,
        "features_epoch": 4,
        "curvature_shard": 2,
        "curvature_epoch": 2,
        "probes_epoch": 4,
        "probe_tables": 1,
        "plot_probes": 1,
        "probes": 1,
    }

    # Epoch subsets; ablation alone when features are off; nothing when everything is off.
    subset = feature_config(
        ckpts,
        features={"epochs": [2, 6], "enabled": False},
        probes={"enabled": False},
        ablation={"epochs": [6]},
    )
    jobs = planned_jobs(wf, tmp_path, configfile=write_config(tmp_path / "subset.yaml", subset))
    assert jobs["ablation_epoch"] == 1 and jobs["ablation_tables"] == 1
    assert not {"features_epoch", "probes_epoch", "probe_tables", "plot_probes"} & set(jobs)
    subset = feature_config(ckpts, features={"epochs": [2, 6]}, ablation={"enabled": False})
    jobs = planned_jobs(wf, tmp_path, configfile=write_config(tmp_path / "off.yaml", subset))
    assert jobs["features_epoch"] == 2 and jobs["probes_epoch"] == 2
    assert not {"ablation_epoch", "ablation_tables", "plot_ablation"} & set(jobs)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"features": {"layers": ["b9"]}}, "runs.tiny.features.layers: small_cnn has no module(s) ['b9']"),
        ({"probes": {"seed": [0]}}, "runs.tiny.probes: Additional properties are not allowed ('seed'"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(tmp_path, sections, message):
    """Through Snakemake, before any job; every other check: tests/unit/config (no Snakemake)."""
    wf = copy_workflow(tmp_path / "wf")
    cfg = write_config(tmp_path / "bad.yaml", feature_config(tmp_path / "model_parameters", **sections))
    proc = snakemake(wf, tmp_path, "--dry-run", configfile=cfg, check=False)
    assert proc.returncode != 0
    assert message in proc.stdout
    assert not (tmp_path / "results").exists()


def test_features_file_and_cache_key(tiny_run):
    _, work, _, ckpts = tiny_run
    data = read_dataset(work / RESULTS.dataset("tiny"))
    path = work / RESULTS.features("tiny", 0, 4)
    features = FeatureSet(path)
    assert features.layers == ["block1", "block2", "block3"]
    assert features.representations == ["pooled", "stats", "spectral"]
    assert features.splits == ["train", "test"] and features.dtype == "float32"
    np.testing.assert_array_equal(features.labels("train"), data.train_labels)
    assert features.array("test", "block3", "pooled").shape == (len(data.test_labels), 64)
    assert features.array("train", "block1", "spectral").shape == (len(data.train_labels), 8)
    assert features.attrs["checkpoint_sha256"] == file_sha256(ckpts / "index-0_epoch-4.pt")

    # The key the workflow wrote is the one the library computes from the config's settings:
    # the same settings read the file from the cache, another dtype rebuilds it.
    settings = FeatureSettings(representations=RepresentationSettings(names=("pooled", "stats", "spectral")))
    assert features.attrs["spec"] == json.dumps(settings.spec(), sort_keys=True)
    sha = file_sha256(ckpts / "index-0_epoch-4.pt")
    hit = load_or_extract(
        path, lambda: pytest.fail("a cache hit must not load the model"), data, sha, settings
    )
    assert hit.hit and hit.reason == "cache hit"
    copy_path = work / "epoch_0004_copy.h5"
    copy_path.write_bytes(path.read_bytes())
    other = FeatureSettings(dtype="float16")
    miss = load_or_extract(copy_path, SmallCNN(num_classes=10), data, sha, other, device="cpu")
    assert not miss.hit and miss.reason == "spec changed (dtype)"


def test_probe_tables(tiny_run):
    _, work, _, _ = tiny_run
    per_epoch = {e: pd.read_csv(work / RESULTS.probe_table("tiny", 0, e)) for e in EPOCHS}
    for epoch, table in per_epoch.items():
        assert list(table.columns) == PROBE_COLUMNS
        ok = table[table["status"] == "ok"]
        assert (ok["epoch"] == epoch).all() and ok["accuracy"].between(0, 1).all()
        assert set(ok["seed"]) == {0, 1} and set(ok["layer"]) == {"block1", "block2", "block3"}
        statuses = table.groupby("target")["status"].first().to_dict()
        first_task = epoch < 4
        assert statuses["class"] == "ok"
        assert statuses["cohort"] == ("skipped: no old classes yet (first task)" if first_task else "ok")
        assert statuses["curvature_q4"] == (
            "ok" if epoch in CURV_EPOCHS else "skipped: curvature not computed at this epoch"
        )
        # Curvature exists for training images only: scored on the holdout, never on test.
        assert set(ok.loc[ok["target"] == "curvature_q4", "eval_split"]) <= {"holdout"}
        active = {0: 4, 2: 4, 4: 7, 6: 10}[epoch]
        assert set(ok.loc[ok["target"] == "class", "n_classes"]) == {active}
        assert set(ok.loc[ok["target"] == "cohort", "n_classes"]) <= {2}
    summary = pd.read_csv(work / RESULTS.table("probes", "tiny"))
    assert {"accuracy_mean", "accuracy_seed_std", "accuracy_index_std", "accuracy_ci95", "chance"} <= set(
        summary.columns
    )
    ok = summary[summary["status"] == "ok"]
    assert (ok["n_seeds"] == 2).all() and (ok["n_indices"] == 1).all()
    assert ok["accuracy_index_std"].isna().all()  # one index: no spread over indices
    # 4 epochs x 3 layers x 3 representations; targets x eval splits as above
    assert len(ok[(ok["target"] == "class") & (ok["eval_split"] == "holdout")]) == 4 * 9
    row = ok[(ok["epoch"] == 6) & (ok["layer"] == "block2") & (ok["representation"] == "pooled")]
    row = row[(row["target"] == "class") & (row["eval_split"] == "test")].iloc[0]
    seeds = per_epoch[6]
    seeds = seeds[(seeds["layer"] == "block2") & (seeds["representation"] == "pooled")]
    seeds = seeds[(seeds["target"] == "class") & (seeds["eval_split"] == "test")]["accuracy"]
    assert row["accuracy_mean"] == pytest.approx(seeds.mean())
    assert row["accuracy_seed_std"] == pytest.approx(seeds.std(ddof=1))


def test_ablation_tables_and_figures(tiny_run):
    wf, work, cfg, _ = tiny_run
    for epoch in EPOCHS:
        table = pd.read_csv(work / RESULTS.ablation_table("tiny", 0, epoch))
        assert list(table.columns) == ABLATION_COLUMNS
        # 3 blocks x (whole block + 4 channel groups) x 2 modes, per cohort present
        cohorts = ["new", "all"] if epoch < 4 else ["old", "new", "all"]
        assert sorted(table["cohort"].unique()) == sorted(cohorts)
        assert len(table) == 3 * 5 * 2 * len(cohorts)
        assert set(table["group"]) >= {"all", "ch0-3", "ch12-15", "ch48-63"}
        np.testing.assert_allclose(table["delta_accuracy"], table["accuracy"] - table["accuracy_base"])
    summary = pd.read_csv(work / RESULTS.table("ablation", "tiny"))
    assert {"delta_accuracy_mean", "delta_accuracy_ci95", "delta_loss_mean", "n_indices"} <= set(
        summary.columns
    )
    assert set(summary["epoch"]) == set(EPOCHS)
    for name in ("probe_accuracy", "ablation_effect"):
        for ext in ("png", "pdf"):
            assert (work / RESULTS.figure(name, ext, "tiny")).stat().st_size > 10_000
    assert planned_jobs(wf, work, "probes", "ablation", "features", configfile=cfg) == {}


def test_what_reruns(tiny_run, tmp_path):
    """Snakemake's rerun decisions match the features' cache key: execution settings rerun
    nothing, the layer spec reruns features and probes, a new checkpoint reruns its epoch."""
    wf, work, _, ckpts = tiny_run

    def plan(**sections):
        return planned_jobs(
            wf, work, configfile=write_config(tmp_path / "c.yaml", feature_config(ckpts, **sections))
        )

    assert plan(features={"batch_size": 7}, ablation={"batch_size": 5}) == {}
    assert plan(features={"layers": ["block2", "block3"]}) == {
        "features_epoch": 4,
        "probes_epoch": 4,
        "probe_tables": 1,
        "plot_probes": 1,
        "all": 1,
    }
    assert plan(probes={"seeds": [0, 1, 2]}) == {
        "probes_epoch": 4,
        "probe_tables": 1,
        "plot_probes": 1,
        "all": 1,
    }
    # The ridge probe of classes: probes only (the default kind, softmax, was not in the params).
    assert plan(probes={"kind": "ridge"}) == {
        "probes_epoch": 4,
        "probe_tables": 1,
        "plot_probes": 1,
        "all": 1,
    }
    assert plan(ablation={"channel_groups": 2})["ablation_epoch"] == 4

    # A new checkpoint at epoch 4 (no curvature there): that epoch's jobs and the run's tables.
    cfg = write_config(tmp_path / "tiny.yaml", feature_config(ckpts))
    before = {e: (work / RESULTS.features("tiny", 0, e)).stat().st_mtime_ns for e in EPOCHS}
    save_random_checkpoint(SmallCNN, ckpts / "index-0_epoch-4.pt", seed=99, num_classes=10)
    plan = snakemake(wf, work, "--dry-run", configfile=cfg).stdout
    assert job_stats(plan) == {
        "evaluate_checkpoint": 1,
        "accuracy_tables": 1,
        "plot_accuracy": 1,
        **{rule: 1 for rule in PER_EPOCH},
        **RUN_TABLES,
        "all": 1,
    }
    for rule in ("features_epoch", "ablation_epoch"):
        assert planned_wildcards(plan, rule) == ["run=tiny, index=0, epoch=0004"]
    snakemake(wf, work, configfile=cfg)
    after = {e: (work / RESULTS.features("tiny", 0, e)).stat().st_mtime_ns for e in EPOCHS}
    assert [e for e in EPOCHS if after[e] != before[e]] == [4]
    rebuilt = FeatureSet(work / RESULTS.features("tiny", 0, 4))
    assert rebuilt.attrs["checkpoint_sha256"] == file_sha256(ckpts / "index-0_epoch-4.pt")
    assert planned_jobs(wf, work, configfile=cfg) == {}
