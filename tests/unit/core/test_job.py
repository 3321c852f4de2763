"""The one loader of a checkpoint job: data, schedule, active and new classes, model, hashes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from epochlens.data import write_dataset
from epochlens.errors import CheckpointError, ConfigError
from epochlens.job import load_checkpoint_job
from epochlens.models.networks import SmallCNN

SCHEDULE = {"initial_classes": 1, "increment": 1, "epochs_per_task": 10}


@pytest.fixture
def files(tmp_path, tiny_dataset):
    dataset = tmp_path / "dataset.h5"
    write_dataset(tiny_dataset, dataset)
    order = tmp_path / "class_order.npy"
    np.save(order, np.array([2, 0, 1]))
    torch.manual_seed(0)
    ckpt = tmp_path / "epoch_0020.pt"
    torch.save(SmallCNN(num_classes=3, in_channels=3).state_dict(), ckpt)
    return dataset, order, ckpt


def test_classes_model_and_hashes(files, tiny_dataset):
    dataset, order, ckpt = files
    job = load_checkpoint_job(dataset, ckpt, "small_cnn", "0020", "cpu", order, SCHEDULE)
    assert job.epoch == 20 and job.device == torch.device("cpu")
    # epoch 20 ends task 1: classes 2 (task 0) and 0 (task 1, the new one)
    assert job.active.tolist() == [2, 0] and job.new.tolist() == [0]
    assert job.active_at(30).tolist() == [2, 0, 1]
    model = job.model
    assert job.model is model  # built once
    expected = torch.load(ckpt, weights_only=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    hashes = job.input_hashes()
    assert hashes == {
        "dataset": tiny_dataset.content_hash,
        "class_order": hashlib.sha256(order.read_bytes()).hexdigest(),
        "checkpoint": hashlib.sha256(ckpt.read_bytes()).hexdigest(),
    }


def test_without_a_class_order_and_lazily(files, tmp_path):
    dataset, _, ckpt = files
    job = load_checkpoint_job(dataset, tmp_path / "missing.pt", "small_cnn", 20, "cpu")
    assert job.schedule is None and job.active is None and job.class_order is None
    with pytest.raises(CheckpointError, match="missing.pt: checkpoint not found"):
        job.model  # noqa: B018 - the model is loaded on first use only
    with pytest.raises(ConfigError, match="device: 'tpu'"):
        load_checkpoint_job(dataset, ckpt, "small_cnn", 20, "tpu")


def test_weights_of_another_model_name_the_closest_one(files, tmp_path):
    """A dict checkpoint holding a ResNet-18 read as the configured small CNN: the error lists the
    misfit and names the built-in whose keys and shapes the file has."""
    from epochlens.models.networks import ResNet18LoP

    dataset, order, _ = files
    ckpt = tmp_path / "resnet.pt"
    torch.save({"model": ResNet18LoP(num_classes=3, in_channels=3).state_dict(), "step": 7}, ckpt)
    job = load_checkpoint_job(
        dataset, ckpt, {"name": "small_cnn", "key": "model"}, 20, "cpu", order, SCHEDULE
    )
    with pytest.raises(CheckpointError) as err:
        job.model  # noqa: B018
    message = str(err.value)
    assert "resnet.pt: the weights do not fit SmallCNN" in message and "missing keys" in message
    assert "the keys look most like 'model.name: resnet18_lop' (100% of names and shapes shared)" in message
