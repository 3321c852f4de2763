"""Probes on stored activations in the workflow (checkpoints.source: activations).

The tiny run (digits, random SmallCNN checkpoints) probed at epoch 2 from its model, and a second
run whose features come from that checkpoint's block activations, written by the test's own
forward hooks into a save_to_disk DatasetDict (rows shuffled, aligned back by an id column): both
give the same probe table. The stored run also has a user representation
(``userreps.reps:top2``). Each representation of a stored run is its own features file and probe
table: editing the user representation's file reruns its features and probes only (a version that
returns NaN fails naming the layer and the file), and every other representation's files stay.
"""

from __future__ import annotations

import re

import datasets
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from wfutil import planned_jobs, snakemake, tiny_config, write_config
from wfutil import tiny_run as make_tiny_run

from epochlens.data import read_dataset
from epochlens.features.cache import FeatureSet
from epochlens.layout import RESULTS
from epochlens.models.networks import SmallCNN

pytestmark = pytest.mark.workflow

EPOCH = 2
LAYERS = ("block1", "block2", "block3")
PROBES = {"seeds": [0, 1], "max_epochs": 20}
OFF = {"enabled": False}
STORED_REPS = ("pooled", "stats", "spectral", "userreps.reps:top2")
USER_REP = STORED_REPS[-1]
REPS_CODE = "import torch\n\n\ndef top2(act):\n    return act.flatten(1).topk({k}, dim=1).values{tail}\n"


def write_snapshot(ckpt, data, folder) -> None:
    """Block activations of the checkpoint's model on each split, rows in reverse order, an idx column."""
    model = SmallCNN(num_classes=10)
    model.load_state_dict(torch.load(ckpt, map_location="cpu"))
    model.eval()
    splits = {}
    for split in ("train", "test"):
        n = len(data.labels(split))
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            getattr(model, name).register_forward_hook(lambda m, i, o, k=name, s=seen: s.__setitem__(k, o))
            for name in LAYERS
        ]
        with torch.no_grad():
            model(torch.as_tensor(data.normalized(split, np.arange(n))))
        for h in hooks:
            h.remove()
        order = np.arange(n)[::-1].copy()
        columns = {name: seen[name].numpy()[order] for name in LAYERS} | {"idx": order}
        features = {name: datasets.Array3D(tuple(seen[name].shape[1:]), "float32") for name in LAYERS}
        features["idx"] = datasets.Value("int64")
        splits[split] = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
    datasets.DatasetDict(splits).save_to_disk(str(folder))


def stored_config(ckpts, snapshots, project) -> dict:
    cfg = tiny_config(
        ckpts,
        features={"epochs": [EPOCH]},
        probes=PROBES,
        curvature=OFF,
        ablation=OFF,
        influence=OFF,
    )
    run = cfg["runs"]["tiny"]
    cfg["runs"]["acts"] = {
        "data": run["data"],
        "schedule": run["schedule"],
        "checkpoints": {
            "source": "activations",
            "path": str(snapshots / "epoch_{epoch}"),
            "id_column": "idx",
        },
        "features": {
            "representations": list(STORED_REPS),
            "project_path": str(project),
        },
        "probes": PROBES,
        "curvature": OFF,
        "ablation": OFF,
        "influence": OFF,
    }
    return cfg


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("stored")
    tiny = make_tiny_run(
        root, lambda ckpts: stored_config(ckpts, root / "snapshots", root / "project"), run=False
    )
    (root / "project" / "userreps").mkdir(parents=True)
    (root / "project" / "userreps" / "__init__.py").write_text("")
    (root / "project" / "userreps" / "reps.py").write_text(REPS_CODE.format(k=2, tail=""))
    model_only = stored_config(tiny.ckpts, root / "snapshots", root / "project")
    del model_only["runs"]["acts"]  # its snapshot is written from the model run's data below
    snakemake(tiny.wf, tiny.work, "features", configfile=write_config(root / "model.yaml", model_only))
    data = read_dataset(tiny.work / RESULTS.dataset("tiny"))
    write_snapshot(tiny.ckpts / f"index-0_epoch-{EPOCH}.pt", data, root / "snapshots" / f"epoch_{EPOCH}")
    snakemake(tiny.wf, tiny.work, "probes", configfile=tiny.cfg)
    return tiny, root


def stored_files(work) -> dict:
    """{representation: (features file, probe table)} of the stored run's snapshot."""
    return {
        rep: (
            work / RESULTS.stored_features("acts", 0, EPOCH, rep),
            work / RESULTS.stored_probe_table("acts", 0, EPOCH, rep),
        )
        for rep in STORED_REPS
    }


def test_same_features_and_probe_table_as_the_model(stored_run):
    tiny, _ = stored_run
    model = FeatureSet(tiny.work / RESULTS.features("tiny", 0, EPOCH))
    files = stored_files(tiny.work)
    assert files[USER_REP][0].name == "userreps.reps-top2.h5"  # one file per representation
    stored = {rep: FeatureSet(features) for rep, (features, _) in files.items()}
    for rep, fs in stored.items():
        assert fs.layers == list(LAYERS) and fs.representations == [rep]
        assert fs.attrs["kind"] == "stored" and fs.attrs["snapshot_format"] == "save_to_disk"
    for split in ("train", "test"):
        for layer in LAYERS:
            for rep in model.representations:
                np.testing.assert_array_equal(stored[rep].labels(split), model.labels(split))
                np.testing.assert_allclose(
                    stored[rep].array(split, layer, rep), model.array(split, layer, rep), rtol=1e-5, atol=1e-6
                )
            top = stored[USER_REP].array(split, layer, USER_REP)
            assert top.shape[1] == 2 and (top[:, 0] >= top[:, 1]).all()
    keys = ["layer", "representation", "target", "seed", "eval_split"]
    a = pd.read_csv(tiny.work / RESULTS.probe_table("tiny", 0, EPOCH)).drop(columns="run")
    b = pd.concat([pd.read_csv(table) for _, table in files.values()]).drop(columns="run")
    assert set(b["representation"]) == set(STORED_REPS)
    b = b[b["representation"] != USER_REP]
    a, b = (t.sort_values(keys).reset_index(drop=True) for t in (a, b))
    assert len(a) == len(b) > 0
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=0.01)
    summary = pd.read_csv(tiny.work / RESULTS.table("probes", "acts"))
    assert set(summary["representation"]) == set(STORED_REPS)  # probe_tables gathers every file
    # no model: no evaluation job, no checkpoint read for the stored run
    assert not (tiny.work / RESULTS.eval_table("acts", 0, EPOCH)).exists()


def test_editing_a_user_representation_reruns_its_features_and_probes_only(stored_run):
    tiny, root = stored_run
    files = stored_files(tiny.work)
    kept = [p for rep in STORED_REPS[:-1] for p in files[rep]]
    kept.append(tiny.work / RESULTS.features("tiny", 0, EPOCH))
    others = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept}
    code = root / "project" / "userreps" / "reps.py"
    # a version that returns NaN: its job fails naming the layer and the file; nothing else is lost
    code.write_text(REPS_CODE.format(k=2, tail=" * float('nan')"))
    failed = snakemake(tiny.wf, tiny.work, "probes", configfile=tiny.cfg, check=False)
    assert failed.returncode != 0
    assert f"layer 'block1', representation '{USER_REP}'" in failed.stdout and "non-finite" in failed.stdout
    assert "snapshots/epoch_2/train" in failed.stdout
    code.write_text(REPS_CODE.format(k=3, tail=""))
    jobs = planned_jobs(tiny.wf, tiny.work, "probes", configfile=tiny.cfg)
    assert jobs == {
        "features_stored": 1,
        "probes_stored": 1,
        "probe_tables": 1,
        "plot_probes": 1,
        "probes": 1,
    }
    out = snakemake(tiny.wf, tiny.work, "--dry-run", "probes", configfile=tiny.cfg).stdout
    planned = set(re.findall(r"representation=([^,\s]+)", out))
    assert planned == {"userreps.reps-top2"} and "run=tiny" not in out
    snakemake(tiny.wf, tiny.work, "probes", configfile=tiny.cfg)
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in others} == others  # untouched
    top = FeatureSet(files[USER_REP][0]).array("test", "block2", USER_REP)
    assert top.shape[1] == 3 and (top[:, 1] >= top[:, 2]).all()
    assert set(pd.read_csv(files[USER_REP][1])["representation"]) == {USER_REP}
    assert planned_jobs(tiny.wf, tiny.work, "probes", configfile=tiny.cfg) == {}


def test_bad_stored_config_is_refused_at_dry_run(stored_run, tmp_path):
    tiny, root = stored_run
    cfg = stored_config(tiny.ckpts, root / "snapshots", root / "project")
    cfg["runs"]["acts"]["curvature"] = {"enabled": True}
    proc = snakemake(
        tiny.wf, tiny.work, "--dry-run", configfile=write_config(tmp_path / "bad.yaml", cfg), check=False
    )
    assert proc.returncode != 0
    assert "runs.acts: checkpoints.source: activations has no model" in proc.stdout
    assert "remove runs.acts.curvature.enabled: true" in proc.stdout
    # a pattern of features.layers that matches no stored layer: the dry run names the snapshot
    cfg = stored_config(tiny.ckpts, root / "snapshots", root / "project")
    cfg["runs"]["acts"]["features"]["layers"] = ["block*", "layer_*"]
    proc = snakemake(
        tiny.wf, tiny.work, "--dry-run", configfile=write_config(tmp_path / "bad.yaml", cfg), check=False
    )
    assert proc.returncode != 0
    assert (
        "runs.acts.features.layers: " in proc.stdout
        and "epoch_2/train: no layer(s) ['layer_*']" in proc.stdout
    )
    cfg["runs"]["acts"]["features"]["layers"] = ["block[12]"]  # a pattern: block1 and block2
    jobs = planned_jobs(tiny.wf, tiny.work, "probes", configfile=write_config(tmp_path / "ok.yaml", cfg))
    assert jobs["features_stored"] == len(STORED_REPS)


def test_the_example_config_plans_features_and_probes(stored_run, tmp_path):
    """config/examples/stored_activations.yaml, its paths pointed at this test's snapshot and data."""
    tiny, root = stored_run
    cfg = yaml.safe_load((tiny.wf / "config" / "examples" / "stored_activations.yaml").read_text())
    run = cfg["runs"]["vit_acts"]
    run["data"] = {"source": "digits", "holdout_per_class": 5}
    run["checkpoints"]["path"] = str(root / "snapshots" / "epoch_{epoch}")
    run["features"]["project_path"] = str(tmp_path / "code")
    (tmp_path / "code" / "myreps").mkdir(parents=True)
    (tmp_path / "code" / "myreps" / "__init__.py").write_text("")
    (tmp_path / "code" / "myreps" / "pooling.py").write_text(
        "def attention_pool(act):\n    return act.flatten(1)\n"
    )
    jobs = planned_jobs(tiny.wf, tmp_path, configfile=write_config(tmp_path / "example.yaml", cfg))
    assert jobs == {
        "prepare_data": 1, "features_stored": 8, "probes_stored": 8, "probe_tables": 1, "plot_probes": 1,
        "class_order": 1, "all": 1,
    }  # fmt: skip


def test_a_parquet_snapshot_is_decoded_once_for_every_representation(stored_run, tmp_path):
    """The same snapshot as parquet files (as ``pq.write_table`` writes a Dataset's table): one
    decode job, whose .npy layers each representation's job reads, and the same features and
    probe tables as the save_to_disk snapshot's."""
    tiny, root = stored_run
    snapshot = datasets.load_from_disk(str(root / "snapshots" / f"epoch_{EPOCH}"))
    (tmp_path / "pq" / f"epoch_{EPOCH}").mkdir(parents=True)
    for split, ds in snapshot.items():
        pq.write_table(ds.data.table, tmp_path / "pq" / f"epoch_{EPOCH}" / f"{split}.parquet")
    cfg = stored_config(tiny.ckpts, root / "snapshots", root / "project")
    reps = ["pooled", "stats"]
    cfg["runs"] = {"acts_pq": cfg["runs"]["acts"]}
    cfg["runs"]["acts_pq"]["checkpoints"]["path"] = str(tmp_path / "pq" / "epoch_{epoch}")
    cfg["runs"]["acts_pq"]["features"]["representations"] = reps
    configfile = write_config(tmp_path / "pq.yaml", cfg)
    jobs = planned_jobs(tiny.wf, tiny.work, "probes", configfile=configfile)
    assert jobs["activations_decoded"] == 1 and jobs["features_stored"] == jobs["probes_stored"] == 2
    snakemake(tiny.wf, tiny.work, "probes", configfile=configfile)
    decoded = tiny.work / RESULTS.decoded_activations("acts_pq", 0, EPOCH)
    assert sorted(p.name for p in (decoded / "train").iterdir()) == [*(f"{n}.npy" for n in LAYERS), "idx.npy"]
    for rep in reps:
        got = FeatureSet(tiny.work / RESULTS.stored_features("acts_pq", 0, EPOCH, rep))
        want = FeatureSet(tiny.work / RESULTS.stored_features("acts", 0, EPOCH, rep))
        assert got.attrs["snapshot_format"] == "npy"  # read from the decoded layers
        assert got.attrs["snapshot"] == RESULTS.decoded_activations("acts_pq", 0, EPOCH)
        for split in ("train", "test"):
            for layer in LAYERS:
                np.testing.assert_array_equal(got.array(split, layer, rep), want.array(split, layer, rep))
        a, b = (
            pd.read_csv(tiny.work / RESULTS.stored_probe_table(run, 0, EPOCH, rep)).drop(columns="run")
            for run in ("acts", "acts_pq")
        )
        pd.testing.assert_frame_equal(a, b)
    assert planned_jobs(tiny.wf, tiny.work, "probes", configfile=configfile) == {}
    # a representation added: its jobs read the decoded layers; no decode, the others kept
    kept = {rep: tiny.work / RESULTS.stored_features("acts_pq", 0, EPOCH, rep) for rep in reps}
    before = {rep: p.stat().st_mtime_ns for rep, p in kept.items()}
    cfg["runs"]["acts_pq"]["features"]["representations"] = [*reps, "flat"]
    configfile = write_config(tmp_path / "pq.yaml", cfg)
    jobs = planned_jobs(tiny.wf, tiny.work, "probes", configfile=configfile)
    assert "activations_decoded" not in jobs and jobs["features_stored"] == jobs["probes_stored"] == 1
    snakemake(tiny.wf, tiny.work, "probes", configfile=configfile)
    assert {rep: p.stat().st_mtime_ns for rep, p in kept.items()} == before
    assert planned_jobs(tiny.wf, tiny.work, "probes", configfile=configfile) == {}
