"""Seed 004 end to end: a user's plain-PyTorch training script (tests/userproject/training: an MLP
that inverts 2x2 matrices, trained with the MSE on the pipeline's {data} export) on targets of
which a seeded 10% were noised (data.corruption: target_noise), analysed by every stage:
evaluation, curvature (exact mode), features, probes, ablation and influence. One finished run is
shared by the checks, each against numbers computed here from the checkpoint itself."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from dossier_checks import check_detectors, check_influence, check_training_rows
from dossier_checks import read as read_dossier
from quality import SEED, above
from userproject.training_project import FACTORY, build_training_project
from wfutil import copy_workflow, snakemake, write_config

from epochlens.curvature.estimator import rademacher_directions
from epochlens.data import read_dataset
from epochlens.features.cache import FeatureSet
from epochlens.layout import Layout
from epochlens.samples.sheets import SheetLayout

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

RUN, LAST = "inverse", 4
COMMAND = (
    f"{sys.executable} code/train.py --config code/configs/base.json --seed {{seed}} --data {{data}} "
    "--out {output} --resume {resume}"
)
AT_LAST = {"enabled": True, "epochs": [LAST]}
CURVATURE = {"enabled": True, "mode": "exact", "n_directions": 3, "h": 1e-3, "seed": 7}


def run_config() -> dict:
    return {
        "data": {
            "source": "npz",
            "path": "data/matrices.npz",
            "holdout_per_class": 16,
            "corruption": {"kind": "target_noise", "fraction": 0.1, "noise_scale": 3.0, "seed": 1 + SEED},
        },
        "task": "regression",
        "model": {"factory": FACTORY, "kwargs": {"num_outputs": 4, "hidden": 16}, "project_path": "code"},
        "schedule": "none",
        "indices": [0],
        "train": {"seed": SEED},  # the command's {seed}
        "epochs": [0, 2, LAST],
        "checkpoints": {
            "source": "command", "command": COMMAND, "path": "ckpt_{epoch}.pt", "key": "model",
            "repository": "code",
        },
        "curvature": CURVATURE,
        "features": AT_LAST,
        "probes": {"enabled": True, "seeds": [0], "max_epochs": 30},
        "ablation": {**AT_LAST, "channel_groups": 2, "modes": ["zero"]},
        "influence": {
            "enabled": True,
            "methods": ["ekfac", "identity"],
            "queries": {"select": "highest_loss", "max_count": 12},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("regression")
    project = build_training_project(root / "work", n_train=128, n_test=40)
    wf = copy_workflow(root / "wf")
    cfg = write_config(root / "inverse.yaml", {"device": "cpu", "runs": {RUN: run_config()}})
    snakemake(wf, project.root, configfile=cfg)
    paths = Layout(project.root / "results")
    data = read_dataset(paths.dataset(RUN))
    sys.path.insert(0, str(project.repo))
    try:
        from invnet.model import build
    finally:
        sys.path.remove(str(project.repo))
    model = build(in_features=4, num_outputs=4, hidden=16).double()
    state = torch.load(paths.checkpoint(RUN, 0, LAST), weights_only=True)["model"]
    model.load_state_dict({k: v.double() for k, v in state.items()})
    return paths, data, model.eval()


def test_targets_stay_float_and_the_test_mse_is_torchs(finished):
    paths, data, model = finished
    assert data.kind == "regression" and data.train_labels.dtype == np.float32
    assert data.train_labels.shape == (128, 4)  # never cast to class ids
    metrics = pd.read_csv(paths.table("regression_metrics", RUN))
    assert "accuracy" not in metrics.columns
    got = metrics.query(f"epoch == {LAST} and split == 'test' and data_group == 'all'")["mse"].item()
    x, y = data.normalized("test").double(), torch.from_numpy(data.test_labels).double()
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(model(x), y).item()
    assert got == pytest.approx(expected, rel=1e-6)


def test_exact_curvature_is_the_explicit_hessian_of_each_samples_squared_error(finished):
    paths, data, model = finished
    folder = paths.curvature_dir(RUN, 0, LAST)
    curvature = np.load(f"{folder}/per_image_curvature.npy")
    loss = np.load(f"{folder}/per_image_loss.npy")
    assert np.isfinite(curvature).all() and np.isfinite(loss).all()  # every sample: no classes
    x = data.normalized("train").double()
    y = torch.from_numpy(data.train_labels).double()
    for n in (0, 37, 127):
        steps = CURVATURE["h"] * rademacher_directions(
            CURVATURE["seed"], np.array([n]), x.shape[1:], CURVATURE["n_directions"], dtype=torch.float64
        )[0].reshape(CURVATURE["n_directions"], -1)

        def mse(z, n=n):
            return ((model(z.unsqueeze(0))[0] - y[n]) ** 2).mean()

        hess = torch.autograd.functional.hessian(mse, x[n]).reshape(4, 4)
        assert curvature[n] == pytest.approx((steps @ hess).norm(dim=1).mean().item(), rel=1e-4)
        assert loss[n] == pytest.approx(mse(x[n]).item(), rel=1e-5)
    dynamics = pd.read_csv(paths.table("sample_dynamics", RUN))
    assert len(dynamics) == 128 and "learned" in pd.read_csv(paths.table("curvature_per_cohort", RUN))


def test_probes_and_ablations_speak_the_regressions_metric(finished):
    paths, data, _ = finished
    per_epoch = pd.read_csv(paths.probe_table(RUN, 0, LAST))
    assert set(per_epoch["target"]) == {"target", "target_q4", "curvature_q4"}  # no class, no cohort
    ridge = per_epoch[per_epoch["target"] == "target"]
    assert (
        set(ridge["metric"]) == {"r2"} and ridge["accuracy"].isna().all() and np.isfinite(ridge["r2"]).all()
    )
    assert set(per_epoch[per_epoch["target"] == "target_q4"]["metric"]) == {"accuracy"}
    features = FeatureSet(paths.features(RUN, 0, LAST))
    np.testing.assert_array_equal(features.labels("train"), data.train_labels)  # float targets kept
    probes = pd.read_csv(paths.table("probes", RUN))
    assert probes[probes["metric"] == "r2"]["accuracy_mean"].isna().all()
    ablation = pd.read_csv(paths.table("ablation", RUN))
    assert set(ablation["cohort"]) == {"all"} and "delta_accuracy_mean" not in ablation
    whole = ablation[(ablation["group"] == "all") & (ablation["mode"] == "zero")]
    assert (whole["delta_loss_mean"] > 0).all()  # zeroing a whole hidden layer hurts


@pytest.mark.quality
def test_the_noised_targets_are_found_beside_the_loss_and_random_baselines(finished):
    paths, data, _ = finished
    corrupted = np.load(paths.corrupted_indices(RUN))
    assert len(corrupted) == round(0.1 * (128 - 16)) and not data.holdout[corrupted].any()
    detection = pd.read_csv(paths.table("poison_detection", RUN)).set_index(["method", "signal"])
    auroc = detection["auroc"]
    for key in [
        ("ekfac", "self_influence"),
        ("identity", "self_influence"),
        ("loss", "loss"),
        ("random", "random"),
    ]:
        assert np.isfinite(auroc[key]), key
    above("EK-FAC self-influence AUROC of the noised targets", auroc[("ekfac", "self_influence")], 0.8, auroc)
    above("loss AUROC of the noised targets", auroc[("loss", "loss")], 0.8, auroc)
    top = pd.read_csv(paths.table("influence_top_ranked", RUN))
    assert "target" in top.columns and top["target"].str.startswith("[").all()  # the targets trained on
    for figure in ("regression_metrics", "poison_roc", "top_influential_images", "ablation_effect"):
        assert all(Path(f).stat().st_size > 0 for f in paths.figures(figure, RUN)), figure


def test_the_dossier_speaks_the_regressions_error_and_refuses_accuracy(finished):
    """A regression's dossier: targets as trained, the absolute error of the user's model at each
    checkpoint, the data map's analogue from it; no probability of a label, correctness or
    learning time (absent, not computed on the wrong kind of data)."""
    paths, data, model = finished
    rows = check_training_rows(paths, RUN, 0)
    dossier, meta = read_dossier(paths, RUN)
    assert meta["task"] == "regression"
    refused = {"p_label", "margin", "correct", "confidence", "variability", "correctness", "aum"}
    assert refused.isdisjoint(dossier) and {"learning_time", "forgetting_events"}.isdisjoint(dossier)
    np.testing.assert_array_equal(np.stack(rows["target"].to_numpy()), data.train_labels)
    with torch.no_grad():
        pred = model(data.normalized("train").double()).numpy()
    error = np.stack(rows["abs_error"].to_numpy()).astype(np.float64)
    np.testing.assert_allclose(error[:, -1], np.abs(pred - data.train_labels).mean(1), rtol=1e-4)
    np.testing.assert_allclose(rows["error_mean"], error.mean(1), rtol=1e-6)
    np.testing.assert_allclose(rows["error_variability"], error.std(1), rtol=1e-5, atol=1e-9)
    check_influence(paths, RUN, 0, LAST, ["ekfac", "identity"])
    check_detectors(rows, meta)
    assert meta["detectors"][-1] == "loss"  # no AUM without a margin
    assert Path(paths.figure("data_map", "png", RUN)).stat().st_size > 10_000
    # the 2x2 matrices, drawn in the data's own range (they have negative entries)
    sheets = SheetLayout(2, 2)  # a sheet holds them all
    assert dossier["image"].tolist() == [f"thumbs/train_0.png#xywh={2 * p},0,2,2" for p in range(128)] + [
        sheets.name("test", int(i.split(":")[1])) for i in dossier["id"][128:]
    ]
    assert sorted(p.name for p in Path(paths.thumbnails(RUN)).glob("*.png")) == ["test_0.png", "train_0.png"]
