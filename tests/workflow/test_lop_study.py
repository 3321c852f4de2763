"""config/cifar100_lop.yaml on inputs in the real formats: a cifar-100-python folder of pickles,
class_order/index-{i}.npy, and randomly initialised ResNet-18 checkpoints saved as the original
experiment saves them (bare state_dicts named index-{i}_epoch-{e}.pt)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from wfutil import (
    REPO,
    copy_workflow,
    planned_jobs,
    save_random_checkpoint,
    snakemake,
    write_cifar100_folder,
    write_config,
)

from epochlens.layout import Layout
from epochlens.models.networks import ResNet18LoP

pytestmark = pytest.mark.workflow


def lop_config(tmp_path, **run_overrides) -> dict:
    """The shipped study config with its paths pointed at ``tmp_path``."""
    cfg = yaml.safe_load((REPO / "config/cifar100_lop.yaml").read_text())
    run = cfg["runs"]["cifar100_lop"]
    run["data"]["path"] = str(tmp_path / "cifar-100-python")
    run["class_order"]["path"] = str(tmp_path / "lop/class_order/index-{index}.npy")
    run["checkpoints"]["path"] = str(tmp_path / "lop/model_parameters/index-{index}_epoch-{epoch}.pt")
    run.update(run_overrides)
    return cfg


def write_class_orders(tmp_path, indices):
    folder = tmp_path / "lop/class_order"
    folder.mkdir(parents=True, exist_ok=True)
    for i in indices:
        np.save(folder / f"index-{i}.npy", np.random.default_rng(100 + i).permutation(100))


def test_full_study_dry_run_lists_every_checkpoint(tmp_path):
    """21 checkpoints x 3 indices; the DAG only needs the files to exist."""
    write_cifar100_folder(tmp_path / "cifar-100-python", train_per_class=1, test_per_class=1)
    write_class_orders(tmp_path, range(3))
    ckpts = tmp_path / "lop/model_parameters"
    ckpts.mkdir(parents=True)
    for i in range(3):
        for epoch in range(0, 4001, 200):
            (ckpts / f"index-{i}_epoch-{epoch}.pt").touch()
    cfg = write_config(tmp_path / "lop.yaml", lop_config(tmp_path))
    start = time.perf_counter()
    jobs = planned_jobs(REPO, tmp_path, configfile=cfg)
    elapsed = time.perf_counter() - start
    assert jobs == {
        "prepare_data": 1,
        "class_order": 3,
        "evaluate_checkpoint": 63,
        "curvature_shard": 63,
        "curvature_epoch": 63,
        "curvature_tables": 1,
        "plot_curvature": 1,
        "features_epoch": 63,
        "probes_epoch": 63,
        "probe_tables": 1,
        "plot_probes": 1,
        "ablation_epoch": 63,
        "ablation_tables": 1,
        "plot_ablation": 1,
        "accuracy_tables": 1,
        "plot_accuracy": 1,
        "sample_outputs_shard": 3,
        "sample_outputs": 3,
        "sample_dossier": 1,
        "sample_thumbnails": 1,
        "plot_data_map": 1,
        "sample_explorer": 1,
        "all": 1,
    }
    print(f"dry run of the full study: {elapsed:.1f} s")


@pytest.mark.slow
def test_study_runs_on_real_formats(tmp_path):
    write_cifar100_folder(tmp_path / "cifar-100-python", train_per_class=4, test_per_class=2)
    write_class_orders(tmp_path, [0])
    epochs = [0, 200, 400]
    for epoch in epochs:
        save_random_checkpoint(
            ResNet18LoP,
            tmp_path / f"lop/model_parameters/index-0_epoch-{epoch}.pt",
            seed=epoch,
            num_classes=100,
        )
    # Features and ablations at the last epoch, one probe seed, whole blocks only, curvature with 2
    # directions (not 10; what it computes: tests/unit/curvature): ResNet-18 on a CPU.
    cfg = lop_config(
        tmp_path,
        indices=[0],
        epochs=epochs,
        curvature={"n_directions": 2},
        features={"epochs": [400], "representations": ["pooled", "stats"]},
        probes={"seeds": [0]},
        ablation={"epochs": [400], "channel_groups": 0},
    )
    cfg["runs"]["cifar100_lop"]["data"]["holdout_per_class"] = 1
    cfg["device"] = "cpu"
    path = write_config(tmp_path / "lop.yaml", cfg)
    wf = copy_workflow(tmp_path / "wf")
    work = tmp_path / "work"
    work.mkdir()
    snakemake(wf, work, configfile=path)

    paths = Layout(work / "results")
    order = np.load(paths.class_order("cifar100_lop", 0))
    assert np.array_equal(order, np.load(tmp_path / "lop/class_order/index-0.npy"))
    per_class = pd.read_csv(paths.table("accuracy_per_class", "cifar100_lop"))
    test = per_class[per_class["split"] == "test"]
    # Checkpoint 200 holds the model trained on the first 5 classes; 400 on the first 10.
    active = test.groupby("epoch")["class_id"].apply(lambda s: sorted(s)).to_dict()
    assert active == {0: sorted(order[:5]), 200: sorted(order[:5]), 400: sorted(order[:10])}
    assert (test["n"] == 2).all()
    holdout = per_class[per_class["split"] == "holdout"]
    assert (holdout["n"] == 1).all()
    assert Path(paths.figure("accuracy_by_cohort", "png", "cifar100_lop")).exists()
    blocks = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    probes = pd.read_csv(paths.table("probes", "cifar100_lop"))
    assert list(pd.unique(probes["layer"])) == blocks
    ablation = pd.read_csv(paths.table("ablation", "cifar100_lop"))
    assert list(pd.unique(ablation["block"])) == blocks and set(ablation["group"]) == {"all"}
    for name in ("probe_accuracy", "ablation_effect"):
        assert Path(paths.figure(name, "png", "cifar100_lop")).exists()
