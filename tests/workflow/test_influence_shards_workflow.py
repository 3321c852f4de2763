"""influence.shards in the workflow: the jobs a sharded checkpoint plans, results equal to the
unsharded computation, and a lost (killed) shard recomputed alone.

The tiny run (wfutil.tiny_config) trained by the pipeline, influence at epoch 6 by EK-FAC in 2
shards (the other methods' score shards merge alike: tests/unit/influence/test_influence_shards.py),
and LoGra's gradient store in 2 shards. A job killed before it wrote its
output leaves no output (outputs are written atomically), and the jobs that merge the shards have
not run yet: the tests delete a shard's file and what comes after it, which is what Snakemake finds
after such a kill.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from wfutil import copy_workflow, planned_jobs, snakemake, tiny_config, write_config
from wfutil import tiny_run as make_tiny_run

from epochlens import config as run_config
from epochlens.influence.factor_groups import group_names, merged_groups, save_factor_groups
from epochlens.influence.io import load_factors
from epochlens.influence.projected_basis import store_curvature
from epochlens.influence.study_factors import fit_checkpoint_factors
from epochlens.influence.study_scores import checkpoint_scores
from epochlens.influence.study_store import store_shard
from epochlens.influence.study_store_scores import store_checkpoint_scores
from epochlens.job import load_checkpoint_job
from epochlens.layout import Layout
from epochlens.study.score_queries import score_queries

pytestmark = pytest.mark.workflow

OFF = {"enabled": False}
METHODS = ["ekfac", "logra"]


def sharded_config(tmp_path, shards: int, methods=METHODS) -> dict:
    cfg = tiny_config(tmp_path / "unused")
    spec = cfg["runs"]["tiny"]
    spec["checkpoints"] = {"source": "train"}
    spec["train"] = {"lr": 0.02, "early_stopping": False}
    spec.update(curvature=dict(OFF), features=dict(OFF), probes=dict(OFF), ablation=dict(OFF))
    spec["influence"] = {
        "enabled": True,
        "methods": methods,
        "shards": shards,
        "queries": {"max_count": 6},
        "transforms": ["none"],
    }
    return cfg


def test_sharded_jobs_are_planned(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    cfg = sharded_config(tmp_path, 3, ["ekfac", "kfac", "diagonal", "identity", "tracin", "logra"])
    jobs = planned_jobs(wf, tmp_path, configfile=write_config(tmp_path / "s.yaml", cfg))
    assert jobs["influence_covariances"] == 2 * 3  # ekfac, kfac
    assert jobs["influence_eigenbasis"] == 1  # ekfac (kfac's factors are its eigenbasis)
    assert jobs["influence_corrections"] == 2 * 3  # ekfac, diagonal
    assert jobs["influence_factors"] == 3
    assert jobs["influence_score_shard"] == 5 * 3 and jobs["influence_scores"] == 5
    assert jobs["influence_store_shard"] == 3
    assert jobs["influence_store_eigen"] == jobs["influence_store_scores"] == 1
    # One shard (1 of 3) of the diagonal's factors needs only the data and its checkpoint.
    shard = Layout().influence_shard("corrections", "tiny", 0, 6, "diagonal", 1, 3)
    assert planned_jobs(wf, tmp_path, shard, configfile=tmp_path / "s.yaml") == {
        "prepare_data": 1,
        "class_order": 1,
        "train_tiny": 1,
        "influence_corrections": 1,
    }


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    cfg = sharded_config(root, 2)
    targets = [Layout().influence_file("metadata.json", "tiny", 0, 6, m) for m in METHODS]
    run = make_tiny_run(root, cfg, *targets, name="shards")
    return run, targets


def _checkpoint(run):
    """(the validated run section, the epoch-6 checkpoint job) of the sharded run."""
    cfg = run_config.validate(sharded_config(run.work, 2), run.wf / "config/schema.yaml")
    spec = json.loads(json.dumps(cfg))["runs"]["tiny"]
    paths = run.paths
    job = load_checkpoint_job(
        paths.dataset("tiny"), paths.checkpoint("tiny", 0, 6), "small_cnn", 6, "cpu",
        paths.class_order("tiny", 0), spec["schedule"],
    )  # fmt: skip
    return spec, job


def _files(run, method):
    paths = run.paths
    return (
        Path(paths.influence_file("scores.npz", "tiny", 0, 6, method)),
        Path(paths.influence_file("factors.pt", "tiny", 0, 6, method)),
    )


@pytest.mark.slow
def test_sharded_results_equal_the_unsharded_job(sharded_run):
    """Scores of the 2 shards, concatenated, equal the unsharded job's with the same factors up to
    float32 rounding (1e-6 of the largest score: a shard's batches hold other images than the
    unsharded pass's, and its float32 forward and backward passes may round differently; 1e-7
    measured, bit-equal where batches coincide: tests/unit/influence/test_influence_shards.py);
    factors within 1e-12 relative of the unsharded fit (the same sums added in another order)."""
    run, _ = sharded_run
    cfg = json.loads(
        json.dumps(run_config.validate(sharded_config(run.work, 2), run.wf / "config/schema.yaml"))
    )
    spec = cfg["runs"]["tiny"]
    paths = run.paths
    job = load_checkpoint_job(
        paths.dataset("tiny"), paths.checkpoint("tiny", 0, 6), "small_cnn", 6, "cpu",
        paths.class_order("tiny", 0), spec["schedule"],
    )  # fmt: skip
    scores_path, factors_path = _files(run, "ekfac")
    params = run_config.influence_score_params("tiny", spec, "ekfac", 6)
    fparams = run_config.influence_factor_params(spec, "ekfac")
    fit = fit_checkpoint_factors(job, fparams["settings"], spec["influence"], task=fparams["task"])
    ref, got = merged_groups(fit.groups), load_factors(factors_path)
    assert got.key == ref.key
    for name, lf in ref.layers.items():
        for attr in ("activation_values", "gradient_values", "corrected"):
            a, b = getattr(lf, attr), getattr(got.layers[name], attr)
            assert torch.allclose(b, a, rtol=1e-12, atol=1e-12 * float(a.abs().max())), (name, attr)
    ref_scores = checkpoint_scores(
        job, "ekfac", params, spec["influence"], factors_path=factors_path, queries=score_queries(job, params)
    )
    with np.load(scores_path) as npz:
        np.testing.assert_array_equal(npz["query_test_indices"], ref_scores.arrays["query_test_indices"])
        for name in ("self_influence", "loss", "pairwise_none"):
            want = ref_scores.arrays[name]
            np.testing.assert_allclose(
                npz[name], want, rtol=1e-6, atol=1e-6 * np.nanmax(np.abs(want)), err_msg=name
            )
    meta = json.loads(Path(paths.influence_file("metadata.json", "tiny", 0, 6, "ekfac")).read_text())
    assert meta["shards"] == 2 and meta["n_scored"] == int(
        np.isfinite(ref_scores.arrays["self_influence"]).sum()
    )


@pytest.mark.slow
def test_a_sharded_store_gives_the_unsharded_scores(sharded_run, tmp_path):
    """LoGra's store in 2 shard jobs, scored by the workflow, equals one shard written and scored
    here, up to float32 rounding of the forward passes (other batches)."""
    run, _ = sharded_run
    spec, job = _checkpoint(run)
    paths = run.paths
    params = run_config.influence_score_params("tiny", spec, "logra", 6)
    store = [(tmp_path / "s.npy", tmp_path / "s.pt")]
    store_shard(job, params, spec["influence"], 0, 1, *store[0])
    store_curvature([store[0][1]], "gauss_newton").save(tmp_path / "curvature.pt")
    ref = store_checkpoint_scores(
        job,
        "logra",
        params,
        spec["influence"],
        store,
        tmp_path / "curvature.pt",
        queries=score_queries(job, params),
    )
    with np.load(paths.influence_file("scores.npz", "tiny", 0, 6, "logra")) as npz:
        for name in ("self_influence", "loss", "pairwise_none"):
            want = ref.arrays[name]
            np.testing.assert_allclose(
                npz[name], want, rtol=1e-6, atol=1e-6 * np.nanmax(np.abs(want)), err_msg=name
            )
    meta = json.loads(Path(paths.influence_file("metadata.json", "tiny", 0, 6, "logra")).read_text())
    assert meta["shards"] == 2 and meta["settings"]["projection"]["dim"] == 32


@pytest.mark.slow
def test_a_lost_shard_is_recomputed_alone(sharded_run):
    run, targets = sharded_run
    wf, work, cfg = run.wf, run.work, run.cfg
    assert planned_jobs(wf, work, *targets, configfile=cfg) == {}
    paths = run.paths
    scores_path, factors_path = _files(run, "ekfac")
    with np.load(scores_path) as npz:
        before = {k: npz[k] for k in npz.files}
    # A score shard killed (so the scores were never merged): that shard, then the concatenation
    # (planned with the files moved aside and back: running them is the correction shard's case).
    merged = [Path(paths.influence_file(n, "tiny", 0, 6, "ekfac")) for n in ("scores.npz", "metadata.json")]
    lost = [Path(paths.influence_shard("scores", "tiny", 0, 6, "ekfac", 1, 2)), *merged]
    for path in lost:
        path.rename(path.with_name(path.name + ".aside"))
    assert planned_jobs(wf, work, *targets, configfile=cfg) == {
        "influence_score_shard": 1,
        "influence_scores": 1,
    }
    for path in lost:
        path.with_name(path.name + ".aside").rename(path)
    # A correction shard of EK-FAC killed: that shard, the factors summed again, the scores after.
    old = load_factors(factors_path)
    shards = [Path(paths.influence_shard("scores", "tiny", 0, 6, "ekfac", k, 2)) for k in range(2)]
    _lose(
        Path(paths.influence_shard("corrections", "tiny", 0, 6, "ekfac", 0, 2)),
        factors_path,
        *shards,
        *merged,
    )
    assert planned_jobs(wf, work, *targets, configfile=cfg) == {
        "influence_corrections": 1,
        "influence_factors": 1,
        "influence_score_shard": 2,
        "influence_scores": 1,
    }
    snakemake(wf, work, *targets, configfile=cfg)
    new = load_factors(factors_path)
    for name, lf in old.layers.items():
        assert torch.equal(new.layers[name].corrected, lf.corrected)
    with np.load(scores_path) as npz:
        for k, v in before.items():
            np.testing.assert_array_equal(npz[k], v)  # the same computation: the same bits


def _lose(*paths: Path) -> None:
    for path in paths:
        path.unlink()


@pytest.mark.slow
def test_factors_in_layer_groups_give_the_whole_models_scores(sharded_run, tmp_path):
    """influence.factor_memory_gb small enough for one layer per group: the job fits, writes and
    scores a group at a time; the scores equal those of the factors in one group up to the order
    of float64 sums."""
    run, _ = sharded_run
    spec, job = _checkpoint(run)
    fparams = run_config.influence_factor_params(spec, "ekfac")
    params = run_config.influence_score_params("tiny", spec, "ekfac", 6)
    queries = score_queries(job, params)
    scores = {}
    for name, budget in (("whole", 4.0), ("grouped", 1e-9)):
        execution = {**spec["influence"], "factor_memory_gb": budget}
        fit = fit_checkpoint_factors(job, fparams["settings"], execution, task=fparams["task"])
        path = tmp_path / f"{name}.pt"
        save_factor_groups(path, fit.groups, fit.names, fit.key)
        assert len(fit.spectrum()) == sum(len(g) for g in fit.names) == 4  # small_cnn: 4 layers
        scores[name] = checkpoint_scores(job, "ekfac", params, execution, factors_path=path, queries=queries)
    assert group_names(tmp_path / "whole.pt") is None and len(group_names(tmp_path / "grouped.pt")) == 4
    for key in ("self_influence", "loss", "pairwise_none"):
        ref = scores["whole"].arrays[key]
        np.testing.assert_allclose(
            scores["grouped"].arrays[key], ref, rtol=1e-9, atol=1e-9 * np.nanmax(np.abs(ref))
        )
