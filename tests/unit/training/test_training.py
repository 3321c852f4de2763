"""Training that survives its wall time: the train log written as epochs finish, and a job resumed
from its saved state ending with the same checkpoints and log, byte for byte, as one never stopped.

digits, 10 classes, 4 initial +3 every 3 epochs (9 epochs), checkpoints every 2 epochs and at the
task boundaries (0, 2, 3, 4, 6, 8, 9), flip/crop augmentation (so the shuffling generator also
feeds the augmentation), early stopping (so the best weights of a task are part of the state).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from epochlens.data import holdout_mask, load_digits
from epochlens.models import build_model
from epochlens.schedule import ClassSchedule
from epochlens.training import TrainSettings, train_incremental

EPOCHS = [0, 2, 3, 4, 6, 8, 9]
SETTINGS = TrainSettings(batch_size=64, lr=0.02, augment="flip_crop", seed=3)


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    data.holdout = holdout_mask(data.train_labels, 5)
    return data


def schedule() -> ClassSchedule:
    return ClassSchedule(np.random.default_rng(0).permutation(10), 4, 3, 3)


def train(data, folder: Path, settings=SETTINGS, init_seed=None, on_checkpoint=None, **kwargs):
    """Train into ``folder`` (checkpoints and train_log.csv); return the returned table."""
    model = build_model("small_cnn", 10, 1, seed=settings.seed if init_seed is None else init_seed)

    def checkpoint_path(epoch: int) -> Path:
        if on_checkpoint is not None:
            on_checkpoint(epoch)
        return folder / f"epoch_{epoch:04d}.pt"

    return train_incremental(
        model,
        data,
        schedule(),
        settings,
        checkpoint_path,
        save_every=2,
        progress=False,
        log_path=folder / "train_log.csv",
        **kwargs,
    )


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(digits, tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    table = train(digits, folder)
    return folder, table


def test_train_log_is_written_as_epochs_finish(digits, uninterrupted, tmp_path):
    reference, table = uninterrupted
    log_file = tmp_path / "train_log.csv"
    lines_at = {}

    def on_checkpoint(epoch):
        lines_at[epoch] = len(log_file.read_text().splitlines()) if log_file.exists() else None

    train(digits, tmp_path, on_checkpoint=on_checkpoint)
    # The file exists from the start; when checkpoint E is written it holds the header and E rows.
    assert lines_at == {0: 1, **{e: 1 + e for e in EPOCHS[1:]}}
    # Complete, it is exactly what the whole table would have written at the end (today's format).
    assert log_file.read_text() == table.to_csv(index=False)
    assert list(pd.read_csv(log_file)["epoch"]) == list(range(1, 10))
    assert files(tmp_path) == files(reference)  # writing the log as it goes changes nothing


@pytest.mark.parametrize("killed_before", [3, 8])
def test_resumed_training_ends_byte_identical(digits, uninterrupted, tmp_path, caplog, killed_before):
    """Snapshot the resume folder when checkpoint ``killed_before`` is about to be written (what a
    kill at that moment leaves; Snakemake deletes the job's outputs), then train again from it
    with a model initialised differently: the state, not the initialisation, must carry on.

    Killed before 3: the last state is that of checkpoint 2, in the middle of task 0, whose
    best-holdout weights (epoch 2's, better than epoch 3's) early stopping restores at epoch 3.
    Before 8: with resume_every=1, the state of epoch 7 (not a checkpoint).
    """
    reference, _ = uninterrupted
    resume = tmp_path / "first/.resume/train"
    snapshot = tmp_path / "snapshot/.resume/train"
    resume_every = 1 if killed_before == 8 else None

    def on_checkpoint(epoch):
        if epoch == killed_before:
            shutil.copytree(resume, snapshot)

    first = tmp_path / "first"
    train(digits, first, on_checkpoint=on_checkpoint, resume_dir=resume, resume_every=resume_every)
    assert snapshot.is_dir()
    assert (snapshot / "README.txt").read_text().startswith("Resume state of a training job")

    again = tmp_path / "again"
    with caplog.at_level(logging.INFO, logger="epochlens"):
        train(digits, again, init_seed=99, resume_dir=snapshot, resume_every=resume_every)
    resumed_at = killed_before
    assert f"resuming training at epoch {resumed_at} of 9" in caplog.text
    assert files(again) == files(reference)  # every checkpoint (restored or trained) and the log


def test_resume_state_of_other_settings_is_discarded(digits, uninterrupted, tmp_path, caplog):
    reference, _ = uninterrupted
    resume = tmp_path / ".resume/train"
    other = TrainSettings(**{**vars(SETTINGS), "lr": 0.05})
    train(digits, tmp_path / "other", settings=other, resume_dir=resume)
    assert (resume / "state.pt").is_file()
    with caplog.at_level(logging.INFO, logger="epochlens"):
        train(digits, tmp_path / "mine", resume_dir=resume)
    assert "resume state of other settings, data, model or code; discarded" in caplog.text
    assert "resuming" not in caplog.text
    assert files(tmp_path / "mine") == files(reference)


def test_stopping_early_changes_no_checkpoint_before_it(digits, uninterrupted, tmp_path):
    """stop_epoch (the LDS retrainings stop at the analysed epoch): the checkpoints and log rows up
    to it are the full run's, byte for byte, and nothing after it is trained."""
    reference, table = uninterrupted
    stopped = train(digits, tmp_path, stop_epoch=6)
    assert list(stopped["epoch"]) == list(range(1, 7))
    pd.testing.assert_frame_equal(stopped, table[table["epoch"] <= 6])
    ours = {name: data for name, data in files(tmp_path).items() if name != "train_log.csv"}
    assert ours == {f"epoch_{e:04d}.pt": files(reference)[f"epoch_{e:04d}.pt"] for e in (0, 2, 3, 4, 6)}


def test_warm_start_continues_the_run_from_its_checkpoint(digits, tmp_path):
    """start=(E0, the run's weights at E0): epochs E0+1.. with their classes and learning rates. With
    full-batch plain SGD (the order of the samples and the optimizer's state do not matter) the
    warm-started model at every later checkpoint is the run's own, up to float rounding."""
    import torch

    plain = TrainSettings(batch_size=4096, lr=0.5, momentum=0.0, early_stopping=False, seed=3)
    run = tmp_path / "run"
    run.mkdir()
    full = train(digits, run, settings=plain)
    start = torch.load(run / "epoch_0004.pt", weights_only=True)
    warm = tmp_path / "warm"
    warm.mkdir()
    log = train(digits, warm, settings=plain, init_seed=99, start=(4, start))
    assert list(log["epoch"]) == [5, 6, 7, 8, 9]  # no epoch 0 checkpoint, epochs after 4 only
    np.testing.assert_array_equal(log["lr"], full[full["epoch"] > 4]["lr"])
    np.testing.assert_array_equal(log["num_active"], full[full["epoch"] > 4]["num_active"])
    assert sorted(p.name for p in warm.glob("*.pt")) == [f"epoch_{e:04d}.pt" for e in (6, 8, 9)]

    def gap(a: dict, b: dict) -> float:
        return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)

    def load(folder, e):
        return torch.load(folder / f"epoch_{e:04d}.pt", weights_only=True)

    for e, before in ((6, 4), (8, 6), (9, 8)):  # float rounding (another summation order) vs training
        assert gap(load(warm, e), load(run, e)) < 1e-4 < 1e-2 < gap(load(run, e), load(run, before))
    with pytest.raises(ValueError, match="not resumable"):
        train(digits, tmp_path / "x", settings=plain, start=(4, start), resume_dir=tmp_path / "r")
