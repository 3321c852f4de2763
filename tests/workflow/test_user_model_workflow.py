"""The whole pipeline on a run that epochlens did not train: the user's own ViT-like model
(tests/userproject: a package outside epochlens, trained by a plain loop that saved
``ckpt_{step}.pt`` dicts with the weights under ``model``), images as an ImageFolder tree and as a
``save_to_disk`` folder. Two runs in one config (one Snakemake run, to keep CI short):

* ``folder``: ImageFolder, ``schedule: none`` (every class at every checkpoint; the checkpoints are
  the files found), every stage including influence with a label-flip study;
* ``disk``: the save_to_disk copy with a class-incremental schedule, read from the Trainer's
  ``checkpoint-{step}/`` folders (model.safetensors) that transformers.Trainer wrote.

Then: editing the user's model file reruns the jobs that build the model (and what follows them),
never the data preparation; replacing, adding or removing an image rebuilds the data set; a
factory that cannot be imported fails the dry run, naming the key.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from userproject import build_user_project
from wfutil import REPO, copy_workflow, planned_jobs, snakemake, write_config

from epochlens.layout import Layout

pytestmark = [pytest.mark.slow, pytest.mark.workflow]

EPOCHS = [60, 150]  # steps of the loop's checkpoints (the {epoch} of ckpt_{epoch}.pt)
MODEL_RULES = {
    "evaluate_checkpoint",
    "curvature_shard",
    "features_epoch",
    "ablation_epoch",
    "influence_factors",
    "influence_scores",
}


def user_config(project) -> dict:
    model = {
        "factory": project.factory,
        "kwargs": project.kwargs,
        "project_path": str(project.project_path),
        "output": "logits",
    }
    images = {"size": project.size, "mean": list(project.mean), "std": list(project.std)}
    checkpoints = {"source": "folder", "path": str(project.loop_dir / "ckpt_{epoch}.pt"), "key": "model"}
    small = {
        "curvature": {"n_directions": 2, "batch_size": 64},
        "features": {"representations": ["pooled"]},
        "probes": {"seeds": [0], "max_epochs": 20, "targets": ["class", "curvature"]},
        "ablation": {"channel_groups": 2, "modes": ["zero"], "mean_samples": 16},
    }
    folder = {
        "data": {
            "source": "imagefolder",
            "path": str(project.image_folder),
            "images": images,
            "corruption": {"kind": "label_flip", "fraction": 0.1, "seed": 0},
        },
        "model": model,
        "schedule": "none",
        "checkpoints": checkpoints,
        "epochs": EPOCHS,
        "influence": {
            "enabled": True,
            "methods": ["ekfac", "identity"],
            "fisher": "empirical",
            "queries": {"max_count": 8},
        },
        **small,
    }
    disk = {
        "data": {
            "source": "save_to_disk",
            "path": str(project.saved_dataset),
            "images": {**images, "group_column": "source"},  # each image's source: a data group
            "num_classes": 3,
        },
        "model": model,
        "schedule": {"initial_classes": 2, "increment": 1, "epochs_per_task": 4},
        "checkpoints": {"source": "folder", "path": str(project.trainer_dir / "checkpoint-{epoch}")},
        "epochs": [4, 8],
        **small,
        "features": {"enabled": False},
        "probes": {"enabled": False},
        "ablation": {"enabled": False},
    }
    return {"device": "cpu", "runs": {"folder": folder, "disk": disk}}


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    project = build_user_project(root / "project")
    wf = copy_workflow(root / "wf")
    work = root / "work"
    work.mkdir()
    cfg = write_config(root / "user.yaml", user_config(project))
    snakemake(wf, work, configfile=cfg)
    return project, wf, work, cfg


def test_every_stage_runs_on_the_users_model(user_run):
    project, wf, work, cfg = user_run
    paths = Layout(work / "results")
    # schedule: none analyses the checkpoint files found (here the two chosen by `epochs`)
    acc = pd.read_csv(paths.table("accuracy_per_class", "folder"))
    assert sorted(acc["epoch"].unique()) == EPOCHS
    # the user's last checkpoint classifies the test images as the user measured it
    last = acc[(acc["epoch"] == 150) & (acc["split"] == "test")]
    assert last["n_correct"].sum() / last["n"].sum() == pytest.approx(project.final_test_accuracy, abs=1e-6)
    for table in ("curvature_summary", "probes", "ablation", "poison_detection"):
        assert len(pd.read_csv(paths.table(table, "folder"))) > 0, table
    figures = list((work / "results" / "folder" / "figures").glob("*.png"))
    assert len(figures) >= 8, sorted(f.name for f in figures)
    meta = json.loads(Path(paths.curvature_metadata("folder", 0, 150)).read_text())
    assert "model_code" in meta["provenance"]["inputs"]  # the user's sources, fingerprinted
    # the class-incremental run on the save_to_disk copy and the Trainer's folders: two
    # checkpoints (steps 4 and 8), cohort tables; two classes are active at step 4, three at 8
    cohorts = pd.read_csv(paths.table("accuracy_per_cohort", "disk"))
    assert sorted(cohorts["epoch"].unique()) == [4, 8]
    per_class = pd.read_csv(paths.table("accuracy_per_class", "disk"))
    test = per_class[per_class["split"] == "test"]
    assert test.groupby("epoch")["class_id"].nunique().to_dict() == {4: 2, 8: 3}
    # by data group (the images' source column): every test image of the active classes once
    groups = pd.read_csv(paths.table("accuracy_per_group", "disk"))
    test_groups = groups[groups["split"] == "test"]
    assert set(test_groups["data_group"]) == {"clean", "noisy"}
    assert test_groups.groupby("epoch")["n"].sum().to_dict() == test.groupby("epoch")["n"].sum().to_dict()
    assert "train_epoch" in groups  # steps of a Trainer folder
    assert pd.read_csv(paths.table("accuracy_per_group", "folder")).empty  # no group column
    curvature = pd.read_csv(paths.table("curvature_per_cohort", "disk"))
    assert {"data: clean", "data: noisy"} <= set(curvature["group"])
    # steps are the Trainer's: the epoch each checkpoint was written at, from its trainer_state.json
    states = {
        s: json.loads((project.trainer_dir / f"checkpoint-{s}" / "trainer_state.json").read_text())
        for s in (4, 8)
    }
    assert dict(zip(cohorts["epoch"], cohorts["train_epoch"], strict=True)) == {
        s: states[s]["epoch"] for s in (4, 8)
    }
    assert dict(zip(curvature["epoch"], curvature["train_epoch"], strict=True)) == {
        s: states[s]["epoch"] for s in (4, 8)
    }
    assert "train_epoch" not in pd.read_csv(paths.table("accuracy_per_class", "folder"))
    meta = json.loads(Path(paths.curvature_metadata("disk", 0, 8)).read_text())
    assert len(meta["provenance"]["inputs"]["checkpoint"]) == 64  # the folder's model.safetensors


def test_editing_the_users_model_reruns_its_jobs_only(user_run):
    project, wf, work, cfg = user_run
    assert planned_jobs(wf, work, configfile=cfg) == {}
    layers = project.project_path / "tinyvit" / "layers.py"
    layers.write_text(layers.read_text() + "\n# an edit\n")
    jobs = planned_jobs(wf, work, configfile=cfg)
    assert MODEL_RULES <= set(jobs), jobs
    assert not {"prepare_data", "class_order"} & set(jobs)


def test_replacing_adding_or_removing_an_image_rebuilds_the_data_set(user_run):
    """The image folder reaches prepare_data as one param (its files' paths, sizes and times,
    hashed: epochlens.formats.folder_listing), not as an input per file; hidden files are not data.
    (The test before edited the user's model: the model's jobs are planned throughout.)"""
    project, wf, work, cfg = user_run
    record = base64.urlsafe_b64encode(b"results/folder/data/dataset.h5").decode()  # Snakemake's
    inputs = json.loads((work / ".snakemake/metadata" / record).read_text())["input"]
    assert inputs and not [p for p in inputs if str(project.image_folder) in p]  # one per image before
    image = sorted(Path(project.image_folder).rglob("*.png"))[0]
    content, stat = image.read_bytes(), image.stat()
    extra, hidden = image.with_name("extra.png"), image.with_name(".DS_Store")
    try:
        image.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))  # replaced in place, same size
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert "prepare_data" in planned_jobs(wf, work, configfile=cfg)
        image.write_bytes(content)
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        hidden.write_bytes(b"finder")
        assert "prepare_data" not in planned_jobs(wf, work, configfile=cfg)
        extra.write_bytes(content)
        assert "prepare_data" in planned_jobs(wf, work, configfile=cfg)
    finally:
        extra.unlink(missing_ok=True)
        hidden.unlink(missing_ok=True)
        image.write_bytes(content)
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "prepare_data" not in planned_jobs(wf, work, configfile=cfg)


def test_the_readme_example_config_plans_on_a_user_project(user_run, tmp_path):
    """config/examples/own_model.yaml, with its paths pointed at the test project, is valid and
    plans every stage (so the README's example stays true)."""
    project, wf, _, _ = user_run
    cfg = yaml.safe_load((REPO / "config" / "examples" / "own_model.yaml").read_text())
    run = cfg["runs"]["vit"]
    run["data"]["path"] = str(project.image_folder)
    run["model"]["project_path"] = str(project.project_path)
    run["checkpoints"]["path"] = str(project.loop_dir / "ckpt_{epoch}.pt")
    jobs = planned_jobs(wf, tmp_path, configfile=write_config(tmp_path / "example.yaml", cfg))
    assert MODEL_RULES | {"prepare_data", "probes_epoch", "poison_detection"} <= set(jobs), jobs
    assert jobs["evaluate_checkpoint"] == 2


def test_a_factory_that_cannot_be_imported_fails_before_any_job(user_run, tmp_path):
    project, wf, work, _ = user_run
    cfg = user_config(project)
    cfg["runs"]["folder"]["model"]["factory"] = "tinyvit.modle:build"
    proc = snakemake(
        wf, tmp_path, "--dry-run", configfile=write_config(tmp_path / "bad.yaml", cfg), check=False
    )
    assert proc.returncode != 0
    assert "runs.folder.model" in proc.stdout and "tinyvit.modle" in proc.stdout, proc.stdout[-3000:]
