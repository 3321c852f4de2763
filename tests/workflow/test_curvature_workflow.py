"""Curvature in the workflow: shard/gather job lists, shard invariance, class partition, resume.

The tiny run (wfutil.tiny_config: digits, 4 initial classes +3 every 2 epochs, random checkpoints
at epochs 0, 2, 4, 6 read from a folder), with curvature at epochs 2 (4 classes) and 6 (all 10).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from wfutil import (
    TINY_EPOCHS,
    analysed_at,
    copy_workflow,
    planned_jobs,
    snakemake,
    tiny_config,
    write_config,
    write_random_checkpoints,
)

from epochlens.curvature.io import merged_names
from epochlens.data import read_dataset
from epochlens.layout import RESULTS

pytestmark = pytest.mark.workflow

EPOCHS = TINY_EPOCHS
CURV_EPOCHS = (2, 6)
SAMPLE_RULES = ("sample_outputs", "sample_dossier", "sample_thumbnails", "plot_data_map", "sample_explorer")


def curv_config(ckpts, shards: int, epochs=CURV_EPOCHS, **curvature) -> dict:
    """Features, probes and ablations at epoch 6 only, no sample dossier (23 jobs with 2 shards): these
    tests check the curvature, and of the other stages only that they run, read it (probes) or do
    not rerun (the dossier's reading of it: tests/workflow/test_rerun_graph.py)."""
    epochs = list(epochs) if epochs else None
    curvature = {"shards": shards, "epochs": epochs, **curvature}
    return tiny_config(ckpts, curvature=curvature, samples={"enabled": False}, **analysed_at(6))


def epoch_rel(epoch: int) -> str:
    return RESULTS.curvature_dir("tiny", 0, epoch)


def epoch_dir(work, epoch: int):
    return work / epoch_rel(epoch)


def merged_arrays(work, epoch: int) -> dict[str, np.ndarray]:
    return {key: np.load(epoch_dir(work, epoch) / name) for key, name in merged_names().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny run with curvature computed in 2 shards (whole workflow) and in 1 shard by 2
    processes (torch.distributed, gloo; curvature files only)."""
    root = tmp_path_factory.mktemp("curvature")
    wf = copy_workflow(root / "wf")
    ckpts = write_random_checkpoints(root / "model_parameters")
    work = {}
    for shards in (1, 2):
        work[shards] = root / f"work{shards}"
        work[shards].mkdir()
        cfg = write_config(root / f"shards{shards}.yaml", curv_config(ckpts, shards, processes=3 - shards))
        targets = [] if shards == 2 else [RESULTS.curvature_metadata("tiny", 0, e) for e in CURV_EPOCHS]
        snakemake(wf, work[shards], *targets, configfile=cfg)
    return wf, work, root / "shards2.yaml"


def test_dry_run_job_counts_with_shards(tmp_path):
    ckpts = tmp_path / "model_parameters"
    for epoch in EPOCHS:
        (ckpts / f"index-0_epoch-{epoch}.pt").parent.mkdir(parents=True, exist_ok=True)
        (ckpts / f"index-0_epoch-{epoch}.pt").touch()
    cfg = write_config(tmp_path / "all.yaml", curv_config(ckpts, shards=2, epochs=None))
    jobs = planned_jobs(copy_workflow(tmp_path / "wf"), tmp_path, configfile=cfg)
    assert jobs["curvature_shard"] == len(EPOCHS) * 2
    assert jobs["curvature_epoch"] == len(EPOCHS)
    assert not set(SAMPLE_RULES) & set(jobs)

    # One epoch's metadata builds that epoch's shards and merge, plus the data and class order.
    one = RESULTS.curvature_metadata("tiny", 0, 4)
    assert planned_jobs(tmp_path / "wf", tmp_path, one, configfile=cfg) == {
        "prepare_data": 1,
        "class_order": 1,
        "curvature_shard": 2,
        "curvature_epoch": 1,
    }

    # curvature.enabled: false drops every curvature job; samples.enabled: true (the default)
    # plans the dossier's jobs, false (curv_config) none, and its explorer is refused by name.
    off = tiny_config(ckpts, curvature={"enabled": False, "shards": 2})
    jobs = planned_jobs(tmp_path / "wf", tmp_path, configfile=write_config(tmp_path / "off.yaml", off))
    assert "curvature_shard" not in jobs and "curvature_epoch" not in jobs
    assert set(SAMPLE_RULES) <= set(jobs)
    explorer = RESULTS.explorer("tiny") + "/index.html"
    refused = snakemake(tmp_path / "wf", tmp_path, "--dry-run", explorer, configfile=cfg, check=False)
    assert refused.returncode != 0
    assert "runs.tiny.samples.enabled is false: set it to true" in refused.stdout, refused.stdout[-2000:]


def test_a_shard_job_asks_for_the_memory_of_its_share(runs, tmp_path):
    """Planned on a data set of a million images (a copy of the 2-shard run whose dataset.h5 is
    replaced by one of that shape, allocated lazily), each curvature shard job asks for the memory
    of half the samples (epochlens.memory.job_mem_mb with share 1/2), less than the whole's."""
    import re
    import shutil

    import h5py

    from epochlens.memory import job_mem_mb

    wf, work, cfg = runs
    copy = tmp_path / "work"
    shutil.copytree(work[2], copy, symlinks=True)
    dataset = copy / RESULTS.dataset("tiny")
    with h5py.File(dataset, "w") as f:
        for split, n in (("train", 1_000_000), ("test", 10_000)):
            f.create_group(split).create_dataset(
                "images", shape=(n, 1, 8, 8), dtype="uint8", chunks=(4096, 1, 8, 8)
            )
    target = RESULTS.curvature_metadata("tiny", 0, 6)
    out = snakemake(wf, copy, "--dry-run", target, configfile=cfg).stdout
    asked = {int(m) for m in re.findall(r"rule curvature_shard:.*?mem_mb=(\d+)", out, re.S)}
    inputs = {"dataset": str(dataset), "checkpoint": str(cfg.parent / "model_parameters/index-0_epoch-6.pt")}
    assert asked == {job_mem_mb("curvature_shard", inputs, share=1 / 2)}, out[-3000:]
    assert job_mem_mb("curvature_shard", inputs, share=1 / 2) < job_mem_mb("curvature_shard", inputs)


def test_shard_and_process_invariance(runs):
    _, work, _ = runs
    for epoch in CURV_EPOCHS:
        one, two = merged_arrays(work[1], epoch), merged_arrays(work[2], epoch)
        for key in one:
            assert one[key].dtype == two[key].dtype, key
            assert np.array_equal(one[key], two[key], equal_nan=True), (epoch, key)


def test_nan_exactly_for_inactive_classes(runs):
    _, work, _ = runs
    work = work[2]
    data = read_dataset(work / RESULTS.dataset("tiny"))
    order = np.load(work / RESULTS.class_order("tiny", 0))
    for epoch, n_active in zip(CURV_EPOCHS, (4, 10), strict=True):
        arrays = merged_arrays(work, epoch)
        meta = json.loads((epoch_dir(work, epoch) / "metadata.json").read_text())
        assert meta["epoch"] == epoch
        assert meta["allowed_classes"] == order[:n_active].tolist()
        assert meta["estimator"]["h"] == 1e-3 and meta["estimator"]["n_directions"] == 10
        assert meta["shards"] == 2 and meta["compute_time_seconds"] > 0
        assert set(meta["provenance"]["inputs"]) == {"dataset", "class_order", "checkpoint"}
        assert arrays["labels"].dtype == np.int64
        np.testing.assert_array_equal(arrays["labels"], data.train_labels)
        np.testing.assert_array_equal(arrays["holdout"], data.holdout)
        active = np.isin(data.train_labels, order[:n_active])
        assert meta["stats"]["n_active"] == active.sum()
        assert meta["stats"]["n_samples"] == len(active)
        for key in ("curvature", "directional_eig", "loss", "grad_norm"):
            values = arrays[key]
            assert values.dtype == np.float32 and values.shape == (len(active),)
            assert np.isnan(values[~active]).all(), key
            assert np.isfinite(values[active]).all(), key
        assert (arrays["curvature"][active] >= 0).all()
        assert not arrays["correct"][~active].any()
        assert meta["stats"]["curvature_mean"] == pytest.approx(
            float(arrays["curvature"][active].astype(np.float64).mean())
        )


def test_resume_recomputes_only_the_missing_shard(runs):
    """A run killed after some shards: only the missing shard and the merge run again.

    Deleting a shard while the merged files exist plans nothing: Snakemake does not rerun a job
    whose outputs are newer than its inputs because an intermediate input is gone, so shards may be
    deleted to save space once merged. Resuming an interrupted epoch means the merged files are
    missing too, which is what this test simulates.
    """
    wf, work, cfg = runs
    work = work[2]
    folder = epoch_dir(work, 6)
    before = {
        e: {n: (epoch_dir(work, e) / n).read_bytes() for n in merged_names().values()} for e in CURV_EPOCHS
    }
    shard = folder / "shards/shard_1-of-2.npz"
    kept = folder / "shards/shard_0-of-2.npz"
    kept_mtime = kept.stat().st_mtime_ns
    shard.unlink()
    assert planned_jobs(wf, work, configfile=cfg) == {}
    for name in [*merged_names().values(), "metadata.json"]:
        (folder / name).unlink()
    assert planned_jobs(wf, work, configfile=cfg) == {
        "curvature_shard": 1,
        "curvature_epoch": 1,
        "curvature_tables": 1,
        "plot_curvature": 1,
        "probes_epoch": 1,  # the curvature-quantile target
        "probe_tables": 1,
        "plot_probes": 1,
        "all": 1,
    }
    snakemake(wf, work, configfile=cfg)
    assert shard.exists() and kept.stat().st_mtime_ns == kept_mtime
    assert planned_jobs(wf, work, configfile=cfg) == {}
    after = {
        e: {n: (epoch_dir(work, e) / n).read_bytes() for n in merged_names().values()} for e in CURV_EPOCHS
    }
    assert after == before


def test_tables_figures_and_target(runs):
    wf, work, cfg = runs
    work = work[2]
    data = read_dataset(work / RESULTS.dataset("tiny"))
    n = len(data.train_labels)
    samples = pd.read_csv(work / RESULTS.table("sample_dynamics", "tiny"))
    assert len(samples) == n and samples["sample"].tolist() == list(range(n))
    np.testing.assert_array_equal(samples["label"], data.train_labels)
    loss = {e: merged_arrays(work, e)["loss"].astype(np.float64) for e in CURV_EPOCHS}
    np.testing.assert_allclose(samples["csl"], np.nansum([loss[2], loss[6]], 0), rtol=1e-6)
    order = np.load(work / RESULTS.class_order("tiny", 0))
    first_task = np.isin(data.train_labels, order[:4])
    assert (samples.loc[first_task, "n_epochs"] == 2).all() and (
        samples.loc[~first_task, "n_epochs"] == 1
    ).all()
    cohorts = pd.read_csv(work / RESULTS.table("curvature_per_cohort", "tiny"))
    assert set(cohorts["epoch"]) == set(CURV_EPOCHS) and (cohorts["run"] == "tiny").all()
    for name in ("by_cohort", "distribution", "vs_loss"):
        for ext in ("png", "pdf"):
            assert (work / RESULTS.figure(f"curvature_{name}", ext, "tiny")).stat().st_size > 1000
    assert planned_jobs(wf, work, "curvature", configfile=cfg) == {}


def test_execution_settings_rerun_nothing(runs, tmp_path):
    """batch_size, processes and the device change how the work is done, not the results: no job
    of any stage reruns (the jobs read the device from the config and record it)."""
    wf, work, _ = runs
    ckpts = work[2].parent / "model_parameters"
    changed = curv_config(ckpts, 2, batch_size=7, processes=2)
    cfg = write_config(tmp_path / "changed.yaml", changed)
    assert planned_jobs(wf, work[2], configfile=cfg) == {}
    other_device = {**curv_config(ckpts, 2), "device": "auto"}
    assert planned_jobs(wf, work[2], configfile=write_config(tmp_path / "auto.yaml", other_device)) == {}
    # while the estimator settings do rerun every curvature job
    other_h = write_config(tmp_path / "h.yaml", curv_config(ckpts, 2, h=2e-3))
    jobs = planned_jobs(wf, work[2], configfile=other_h)
    assert jobs["curvature_shard"] == 2 * len(CURV_EPOCHS) and jobs["plot_curvature"] == 1


def test_html_report_has_the_figures_and_captions(runs, tmp_path):
    wf, work, cfg = runs
    report = tmp_path / "report.html"
    snakemake(wf, work[2], "--report", str(report), configfile=cfg)
    html = report.read_text()
    assert "Runs: tiny." in html  # report/workflow.rst, rendered with the config
    for name in ("accuracy_by_cohort", "curvature_by_cohort", "curvature_distribution", "curvature_vs_loss"):
        assert f"{name}.png" in html, name
    assert "cumulative\\nsample loss" in html or "cumulative sample loss" in html


def _faults_kill():
    """benchmarks/_faults_kill.py (``benchmarks/faults.py --kill``), whose loop this test runs small."""
    benchmarks = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import _faults_kill

    return _faults_kill


@pytest.mark.slow
def test_killed_anywhere_ends_equal_to_an_uninterrupted_run(runs, tmp_path):
    """``benchmarks/faults.py --kill`` small: the curvature of epoch 6 (data, class order, 2 shards,
    the merge) made again in a fresh folder whose Snakemake is SIGKILLed with its jobs
    (process group) 3 times, each time started again as the docs say (the same command; --unlock
    when it says the directory is locked), ends with the same files, byte for byte, as the module's
    uninterrupted run, and nothing else was needed."""
    kill = _faults_kill()
    wf, work, cfg = runs
    killed = tmp_path / "killed"
    killed.mkdir()
    targets = (RESULTS.curvature_metadata("tiny", 0, 6),)
    user = kill.Invocation(killed, cfg, wf / "Snakefile", targets)
    report = kill.KillReport()
    shards = frozenset({"curvature_shard", "curvature_epoch"})
    plan = [  # the data set, then twice the shards
        kill.KillAt(frozenset(), 1.0),
        kill.KillAt(shards, 0.5),
        kill.KillAt(shards, 1.5),
    ]
    kill.killed_run(user, work[2] / "results", plan, tmp_path / "logs", report, only_produced=True)
    assert not report.failures, report.failures[0]
    assert len(report.kills) == 3 and report.differences == []
    assert "curvature_shard" in report.kills[1].running
    assert report.compared["npy"] >= 5 and report.compared["npz"] == 2  # merged arrays, shards
    assert set(report.steps) <= {"rerun the same command", "snakemake --unlock (it said: locked)"}
