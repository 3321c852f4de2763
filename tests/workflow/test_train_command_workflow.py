"""The user's own training script as a pipeline step (checkpoints.source: command): a plain-PyTorch
script in its own git repository (tests/userproject/training_project.py) trains three replicates of
a regression (an MLP inverting 2x2 matrices, MSE) on the {subset} it is given; their checkpoints
land in the run's layout and are evaluated, and index 0's influence is judged by LDS, the command
retraining it on random subsets. One finished run is shared by the
read-only checks; then, against it: editing the script retrains (and what depends on it) only once
committed, an uncommitted edit is refused with the fix and allow_dirty passes, a training killed
with Snakemake (SIGKILL of the process group) resumes to the same bytes, and a command that fails
or writes no checkpoint fails with a message that says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from userproject.training_project import FACTORY, TrainingProject, build_training_project
from wfutil import REPO, copy_workflow, job_stats, planned_jobs, snakemake, write_config

from epochlens.layout import Layout

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

RUN = "mlp"
INDICES = [0, 1, 2]
EPOCHS = [0, 2, 4]  # configs/base.json: save_at
COMMAND = (
    f"{sys.executable} code/train.py --config code/configs/base.json --seed {{seed}} --data {{data}} "
    "--out {output} --resume {resume} --subset {subset}"
)
OFF = {"enabled": False}
# index 0's influence at the last epoch, judged by LDS: the command retrains 4 halves of the data
INFLUENCE = {
    "enabled": True,
    "methods": ["identity", "ekfac"],
    "indices": [0],
    "queries": {"select": "all", "max_count": 12},
    "lds": {"enabled": True, "subsets": 4, "fraction": 0.5},
}


def run_config(command: str = COMMAND, influence: dict = OFF, **checkpoints) -> dict:
    return {
        "data": {"source": "npz", "path": "data/matrices.npz"},
        "task": "regression",
        "model": {"factory": FACTORY, "kwargs": {"num_outputs": 4, "hidden": 16}, "project_path": "code"},
        "schedule": "none",
        "indices": INDICES,
        "epochs": EPOCHS,
        "train": {"seed": 10},
        "checkpoints": {
            "source": "command",
            "command": command,
            "path": "ckpt_{epoch}.pt",
            "key": "model",
            "repository": "code",
            **checkpoints,
        },
        "curvature": OFF,
        "features": OFF,
        "probes": OFF,
        "ablation": OFF,
        "influence": influence,
    }


# every stage that builds the model, at the last epoch (cheap): a model edit must reach all or none
ANALYSED = {"curvature": {"epochs": [4], "n_directions": 2}, "features": {"epochs": [4]}}


def config(**runs) -> dict:
    return {"device": "cpu", "runs": runs or {RUN: {**run_config(influence=INFLUENCE), **ANALYSED}}}


class Finished:
    def __init__(self, project: TrainingProject, wf: Path, cfg: Path) -> None:
        self.project, self.wf, self.cfg = project, wf, cfg
        self.work = project.root
        self.paths = Layout(self.work / "results")

    def planned(self, cfg: Path | None = None) -> dict:
        return planned_jobs(self.wf, self.work, configfile=cfg or self.cfg)

    def dry_run(self, cfg: Path) -> subprocess.CompletedProcess:
        return snakemake(self.wf, self.work, "--dry-run", configfile=cfg, check=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Finished:
    root = tmp_path_factory.mktemp("own_training")
    project = build_training_project(root / "work")
    wf = copy_workflow(root / "wf")
    cfg = write_config(root / "own.yaml", config())
    snakemake(wf, project.root, configfile=cfg)
    return Finished(project, wf, cfg)


def checkpoint_bytes(work: Path, index: int) -> dict[int, bytes]:
    paths = Layout(work / "results")
    return {e: Path(paths.checkpoint(RUN, index, e)).read_bytes() for e in EPOCHS}


def test_checkpoints_land_in_the_layout_with_their_provenance_and_are_evaluated(finished):
    paths, project = finished.paths, finished.project
    metrics = pd.read_csv(paths.table("regression_metrics", RUN))
    for index in INDICES:
        for epoch in EPOCHS:
            assert Path(paths.checkpoint(RUN, index, epoch)).is_file()
        meta = json.loads(Path(paths.train_metadata(RUN, index)).read_text())
        assert meta["git"]["commit"] == project.commit and meta["git"]["dirty"] is False
        assert meta["exit_status"] == 0 and meta["duration_seconds"] > 0 and len(meta["config_hash"]) == 64
        assert f"--seed {10 + index} " in meta["command"] and "{" not in meta["command"]
        assert {"train.py", "invnet/model.py", "configs/base.json"} <= set(meta["provenance"]["inputs"])
        assert not (finished.work / paths.index_dir(RUN, index) / ".resume").exists()
        # The script measured its last checkpoint's MSE on {data}'s test split; the pipeline's
        # evaluation of that checkpoint on dataset.h5 agrees: the export is the data it analyses.
        own = json.loads((Path(paths.train_output(RUN, index)) / "metrics.json").read_text())
        last = metrics.query(f"index == {index} and epoch == {EPOCHS[-1]} and split == 'test'")
        assert last["mse"].item() == pytest.approx(own["test_mse"], rel=1e-6)  # its float32 mean
    # replicates differ (their seeds), and the command's output streamed into the job's log
    assert checkpoint_bytes(finished.work, 0)[4] != checkpoint_bytes(finished.work, 1)[4]
    log = Path(paths.log("train", RUN, index=0)).read_text()
    assert "epoch 4/4 loss" in log and f"at commit {project.commit}" in log
    assert "training on 96 of 96 samples" in log  # its {subset}: every sample but the holdout (none)
    with np.load(paths.training_data(RUN)) as data:
        assert data["y_train"].dtype == np.float32 and data["y_train"].shape == (96, 4)  # as stored
        assert data["x_train"].dtype == np.float32 and not data["holdout"].any()


def test_lds_retrains_by_the_command_on_each_subset(finished):
    """influence.lds of a command run: the command retrains index 0 on each of 4 halves of the
    training samples (its {subset}), the retrained checkpoints' test losses are measured, and each
    method gets a finite LDS."""
    paths = finished.paths
    lds = pd.read_csv(paths.table("lds", RUN))
    assert sorted(lds["method"]) == ["ekfac", "identity", "random"], lds
    assert np.isfinite(lds["lds"]).all() and (lds["index"] == 0).all() and (lds["epoch"] == EPOCHS[-1]).all()
    assert (lds["n_subsets"] == 4).all() and (lds["n_queries"] > 0).all()
    with np.load(paths.lds_part(RUN, 0, EPOCHS[-1], 0, 1)) as part:
        assert part["test_losses"].shape == (4, 48) and "log_probs" not in part  # a regression's
        assert (part["masks"].sum(1) == 48).all()
        info = json.loads(str(part["info"]))
    assert info["git"]["commit"] == finished.project.commit and "{data}" in info["provenance"]["inputs"]
    log = Path(paths.log("lds", RUN, index=0, epoch=EPOCHS[-1], name="retrain_0-of-1")).read_text()
    for k in range(4):  # each subset's retraining ran the command, its output in the job's log
        assert f"LDS retraining of subset {k}: training on 48 training samples" in log, log[-3000:]
    assert log.count("training on 48 of 96 samples") == 4 and log.count("epoch 4/4 loss") == 4
    assert not Path(paths.lds_dir(RUN, 0, EPOCHS[-1]), ".retrain").exists()  # its folders are gone
    assert not Path(paths.influence_dir(RUN, 1, EPOCHS[-1], "ekfac")).exists()  # influence.indices: [0]


# What retraining every replicate plans: the training and every job that reads its checkpoints
RETRAINED = {
    "train_mlp": 3,
    "evaluate_checkpoint": 9,
    "regression_tables": 1,
    "plot_regression": 1,
    "curvature_shard": 3,
    "curvature_epoch": 3,
    "curvature_tables": 1,
    "plot_curvature": 1,
    "features_epoch": 3,
    "influence_factors": 1,
    "influence_scores": 2,
    "poison_detection": 1,
    "plot_influence": 1,
    "lds_retrain": 1,  # the command's retrainings run the edited script too
    "lds_tables": 1,
    "plot_lds": 1,
    "sample_outputs_shard": 3,
    "sample_outputs": 3,
    "sample_dossier": 1,
    "plot_data_map": 1,
    "sample_explorer": 1,
    "all": 1,
}


def test_editing_the_script_retrains_what_depends_on_it_once_committed(finished):
    project = finished.project
    script = project.repo / "train.py"
    text, stat = script.read_text(), script.stat()
    try:
        assert finished.planned() == {}
        # A commit that leaves the command's files alone retrains nothing (the commit is no param),
        # and neither does a change to the analysis sections of the config: curvature turned off
        # only rebuilds the dossier (without its curvature columns) and its data map.
        (project.repo / "NOTES.md").write_text("analysis notes\n")
        project.git("add", "NOTES.md")
        project.git("commit", "-q", "-m", "notes")
        cfg = config(**{RUN: {**run_config(), "curvature": {"enabled": False, "n_directions": 3}}})
        dossier = {"sample_dossier": 1, "plot_data_map": 1, "sample_explorer": 1, "all": 1}
        assert finished.planned(write_config(finished.work / "analysis.yaml", cfg)) == dossier

        # Editing the script: refused while uncommitted (the finished checkpoints stay in use) ...
        script.write_text(text + "# tuned\n")
        out = finished.dry_run(finished.cfg).stdout
        assert "modified: train.py" in out and "allow_dirty: true" in out, out[-3000:]
        assert "Until then the finished checkpoints of runs.mlp are analysed as they are" in out
        assert "train_mlp" not in out
        # ... retrains once committed: the training and what reads its checkpoints, not the data.
        project.git("commit", "-q", "-am", "tune")
        out = finished.dry_run(finished.cfg).stdout
        assert job_stats(out) == RETRAINED
        reasons = {line.strip() for line in out.splitlines() if "reason: Updated input files" in line}
        assert reasons == {f"reason: Updated input files: {project.repo / 'train.py'}"}, out[-3000:]
    finally:
        project.git("reset", "-q", "--hard", project.commit)
        script.write_text(text)
        os.utime(script, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert finished.planned() == {}


@contextlib.contextmanager
def restored(*paths: Path, repo: TrainingProject | None = None):
    """Edit ``paths`` within; afterwards their text and times are as before (and ``repo`` back at
    its first commit)."""
    saved = [(p, p.read_bytes(), p.stat()) for p in paths]
    try:
        yield
    finally:
        if repo is not None:
            repo.git("reset", "-q", "--hard", repo.commit)
        for path, data, stat in saved:
            path.write_bytes(data)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def copy_of_finished(finished: Finished, work: Path) -> Path:
    """A working directory with the finished run's results and Snakemake records (times kept)."""
    for name in ("code", "data"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).symlink_to(finished.work / name)
    shutil.copytree(finished.work / "results", work / "results", symlinks=True)
    shutil.copytree(finished.work / ".snakemake" / "metadata", work / ".snakemake" / "metadata")
    return work


def test_a_model_edit_reaches_every_stage_or_none(finished, tmp_path):
    """The model's file (the factory's, imported by the training script): uncommitted, no job
    plans (not one stage on the edited model while the others keep the old one), and a job that
    has to run anyway refuses the edited model as it starts; committed, the training and every
    stage run again, exactly as for the script's commit."""
    project = finished.project
    model = project.repo / "invnet" / "model.py"
    with restored(model, repo=project):
        model.write_text(model.read_text().replace("nn.Tanh()", "nn.ReLU()"))
        out = finished.dry_run(finished.cfg)
        assert out.returncode == 0 and job_stats(out.stdout) == {}, out.stdout[-3000:]
        assert "modified: invnet/model.py" in out.stdout
        assert "analysed as they are, by every stage" in out.stdout

        # a curvature setting changed: its jobs have to run, and refuse the edited model
        work = copy_of_finished(finished, tmp_path / "copy")
        cfg = config(**{RUN: {**run_config(influence=INFLUENCE), **ANALYSED, "curvature": {"epochs": [4]}}})
        target = Layout("results").curvature_metadata(RUN, 0, 4)
        proc = snakemake(
            finished.wf, work, target, configfile=write_config(tmp_path / "c.yaml", cfg), check=False
        )
        assert proc.returncode != 0
        for line in ("invnet/model.py in", "changed since the checkpoint", "Commit the edit"):
            assert line in proc.stdout, proc.stdout[-4000:]
        assert "Traceback" not in proc.stdout.split("invnet/model.py in")[0][-2000:]

        project.git("commit", "-q", "-am", "relu")
        assert finished.planned() == RETRAINED
    assert finished.planned() == {}


def test_each_kind_of_edit_plans_its_stages(finished):
    """Each section of the config, the data file and a checkpoint replaced: the set of jobs each
    plans (the training and everything after it, or one stage and its tables)."""
    planned = finished.planned
    everything = {**RETRAINED, "prepare_data": 1, "class_order": 3, "training_data": 1}
    everything["sample_thumbnails"] = 1  # the dossier's pictures of the data
    with restored(finished.project.npz):
        with np.load(finished.project.npz) as data:
            arrays = dict(data)
        arrays["y_train"] = arrays["y_train"] * 2
        np.savez(finished.project.npz, **arrays)
        assert planned() == everything

    def edited(section: str, **values) -> dict:
        run = {**run_config(influence=INFLUENCE), **ANALYSED}
        run[section] = {**run[section], **values}
        return planned(write_config(finished.work / f"{section}.yaml", config(**{RUN: run})))

    assert edited("train", seed=11) == RETRAINED  # the command uses {seed}
    curvature = {"curvature_shard": 3, "curvature_epoch": 3, "curvature_tables": 1, "plot_curvature": 1}
    samples = {"sample_dossier": 1, "plot_data_map": 1, "sample_explorer": 1}  # they read both
    assert edited("curvature", n_directions=3) == {**curvature, **samples, "all": 1}
    assert edited("features", representations=["pooled"]) == {"features_epoch": 3, "all": 1}
    scores = {"influence_scores": 1, "poison_detection": 1, "plot_influence": 1}  # ekfac's; factors kept
    assert edited("influence", damping=0.2) == {**scores, **samples, "lds_tables": 1, "plot_lds": 1, "all": 1}
    # model.kwargs build the model the checkpoints are loaded into (the command has its own):
    # every job that builds it, and not the training
    builds = {k: n for k, n in RETRAINED.items() if k not in ("train_mlp", "lds_retrain")}
    assert {
        k: n for k, n in edited("model", kwargs={"num_outputs": 4, "hidden": 8}).items() if k != "lds_retrain"
    } == builds

    checkpoint = Path(finished.paths.checkpoint(RUN, 0, 4))
    with restored(checkpoint):  # a checkpoint replaced: every job that reads it, not its training
        state = torch.load(checkpoint, weights_only=True)
        state["model"] = {k: v + 0.01 for k, v in state["model"].items()}
        torch.save(state, checkpoint)
        jobs = planned()
    per_checkpoint = {"evaluate_checkpoint", "curvature_shard", "curvature_epoch", "features_epoch"}
    assert {k: jobs.get(k) for k in per_checkpoint} == dict.fromkeys(per_checkpoint, 1), jobs
    assert {"influence_factors", "influence_scores", "regression_tables", "curvature_tables"} <= set(jobs)
    assert "train_mlp" not in jobs and "prepare_data" not in jobs


def test_a_dirty_tree_is_refused_before_anything_runs_and_allow_dirty_passes(finished, tmp_path):
    project = finished.project
    work = tmp_path / "fresh"  # no results yet: every training has to run
    work.mkdir()
    (work / "code").symlink_to(project.repo)
    (work / "data").symlink_to(project.root / "data")
    config_file = project.repo / "configs" / "q101.json"  # seed 004: a config never committed
    model = project.repo / "invnet" / "model.py"
    text, stat = model.read_text(), model.stat()
    try:
        config_file.write_text((project.repo / "configs" / "base.json").read_text())
        model.write_text(text + "# uncommitted\n")
        cfg = config(**{RUN: run_config(COMMAND.replace("base.json", "q101.json"))})
        proc = snakemake(
            finished.wf, work, "--dry-run", configfile=write_config(tmp_path / "d.yaml", cfg), check=False
        )
        assert proc.returncode != 0
        for line in (
            "runs.mlp.checkpoints: the training command runs from a commit",
            "modified: invnet/model.py",
            "not committed: configs/q101.json (the command uses it)",
            f"git -C {project.repo} add <files>",
            "set runs.mlp.checkpoints.allow_dirty: true",
        ):
            assert line in proc.stdout, proc.stdout[-3000:]
        cfg["runs"][RUN]["checkpoints"]["allow_dirty"] = True
        jobs = planned_jobs(finished.wf, work, configfile=write_config(tmp_path / "a.yaml", cfg))
        assert jobs["train_mlp"] == 3
    finally:
        config_file.unlink(missing_ok=True)
        model.write_text(text)
        os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended ({proc.returncode}) before {path} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.02)


def test_a_training_killed_with_snakemake_resumes_to_identical_checkpoints(finished, tmp_path):
    work = tmp_path / "killed"
    (work / "results" / RUN).mkdir(parents=True)
    (work / "code").symlink_to(finished.project.repo)
    (work / "data").symlink_to(finished.project.root / "data")
    # the prepared data as the finished run has it (times kept): only the training runs here
    shutil.copytree(finished.work / "results" / RUN / "data", work / "results" / RUN / "data")
    target = Layout("results").train_metadata(RUN, 0)
    paths = Layout(work / "results")
    command = [
        *(sys.executable, "-m", "snakemake", "--snakefile", str(finished.wf / "Snakefile")),
        *("--directory", str(work), "--cores", "1", target, "--configfile", str(finished.cfg)),
    ]
    proc = subprocess.Popen(
        command,
        start_new_session=True,
        env={**os.environ, "TRAIN_SLEEP": "0.5"},  # the test script's pace: half a second per epoch
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    output = Path(paths.command_output(RUN, 0))
    wait_for(output / "ckpt_2.pt", proc)
    os.killpg(proc.pid, signal.SIGKILL)  # Snakemake, the job and the command: a lost session
    proc.wait()
    assert not (output / "ckpt_4.pt").exists(), "training finished before the kill: the test proves nothing"
    assert (Path(paths.resume_dir(RUN, 0)) / "state.pt").is_file()

    snakemake(finished.wf, work, "--unlock", configfile=finished.cfg)
    snakemake(finished.wf, work, target, "--rerun-incomplete", configfile=finished.cfg)
    log = Path(paths.log("train", RUN, index=0)).read_text()
    assert "resumed from epoch" in log and "resuming" in log, log
    assert checkpoint_bytes(work, 0) == checkpoint_bytes(finished.work, 0)
    assert json.loads(Path(paths.train_metadata(RUN, 0)).read_text())["resumed"] is True


def test_a_failing_command_and_one_without_checkpoints_fail_with_the_reason(finished, tmp_path):
    python = sys.executable
    cfg = config(
        fails=run_config(f"{python} code/fail.py {{output}}"),
        writes_nothing=run_config(f"{python} code/nothing.py {{output}}"),
    )
    targets = [Layout("results").train_metadata(run, 0) for run in cfg["runs"]]
    work = tmp_path / "bad"
    work.mkdir()
    (work / "code").symlink_to(finished.project.repo)
    (work / "data").symlink_to(finished.project.root / "data")
    proc = snakemake(
        finished.wf, work, *targets, configfile=write_config(tmp_path / "bad.yaml", cfg), check=False
    )
    assert proc.returncode != 0
    for line in (
        "runs.fails.checkpoints.command (index 0) exited with status 3",
        "| step 4: loss nan",
        "| ValueError: the loss is NaN",
        "results/fails/logs/train/index-0.log",
        "runs.writes_nothing.checkpoints.command (index 0) exited 0 but did not write 3 of the 3 checkpoints",
        "ckpt_0.pt (epoch 0), ckpt_2.pt (epoch 2), ckpt_4.pt (epoch 4)",
        "holds: model_final.pt",
        "{output}/ckpt_{epoch}.pt (runs.writes_nothing.checkpoints.path",
    ):
        assert line in proc.stdout, proc.stdout[-4000:]
    assert not Path(Layout(work / "results").checkpoint("writes_nothing", 0, 0)).exists()


def test_the_readme_example_plans_on_a_user_project(finished, tmp_path):
    """config/examples/own_training.yaml (seed 004: three strategies x several seeds, compared),
    with its interpreter and data pointed at the test project, is valid and plans every replicate's
    training and evaluation, and with its commented influence section LDS by the command."""
    text = (REPO / "config" / "examples" / "own_training.yaml").read_text()
    cfg = yaml.safe_load(text)
    lines = [line.strip() for line in text.splitlines()]
    start = lines.index("# influence:")
    end = next(k for k in range(start + 1, len(lines)) if not lines[k].startswith("#   "))
    influence = yaml.safe_load("\n".join(line[2:] for line in lines[start:end]))["influence"]
    for run in cfg["runs"].values():  # as when uncommented: the runs inherit it from q001_baseline
        run["influence"] = influence
    (tmp_path / "code").symlink_to(finished.project.repo)
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 3, 3)).astype(np.float32), rng.standard_normal((40, 9)).astype(np.float32)
    np.savez(tmp_path / "data" / "inverse.npz", x_train=x[:30], y_train=y[:30], x_test=x[30:], y_test=y[30:])
    jobs = planned_jobs(finished.wf, tmp_path, configfile=write_config(tmp_path / "example.yaml", cfg))
    runs = list(cfg["runs"])
    for name in runs:
        assert jobs[f"train_{name}"] == len(cfg["runs"][name]["indices"]), jobs
    assert jobs["training_data"] == len(runs) and jobs["evaluate_checkpoint"] > 0
    assert jobs["lds_retrain"] == len(runs) and jobs["influence_scores"] == 2 * len(runs)
