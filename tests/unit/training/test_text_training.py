"""A text run's transformer trained by the pipeline's loop: built from a config mapping (model.hf.config),
trained on the synthetic polarity data with AdamW, deterministic, and read back by a checkpoint job
exactly as it was trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from epochlens.data import holdout_mask
from epochlens.data.text import write_text_dataset
from epochlens.data.text_rows import read_text_dataset
from epochlens.formats.text import TextSettings, load_polarity
from epochlens.formats.user_model import attach_output_adapter
from epochlens.job import load_checkpoint_job
from epochlens.models.hf import build_hf_model
from epochlens.schedule import ClassSchedule
from epochlens.training import TrainSettings, train_incremental

CONFIG = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 32,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
SETTINGS = TrainSettings(batch_size=16, lr=3e-3, lr_decay=1.0, optimizer="adamw", weight_decay=0.01, seed=1)


@pytest.fixture(scope="module")
def polarity(tmp_path_factory):
    data = load_polarity(TextSettings(max_length=24), train=96, test=24, seed=0)
    data.holdout = holdout_mask(data.train_labels, 4)
    path = tmp_path_factory.mktemp("data") / "dataset.h5"
    write_text_dataset(data, path)
    return path


def model_for(data, seed: int):
    model = build_hf_model(
        CONFIG, "sequence_classification", 2, data.pad_token_id, seed, vocab_size=data.vocab_size
    )
    attach_output_adapter(model, "logits")
    return model


def train(data, folder: Path) -> pd.DataFrame:
    schedule = ClassSchedule(np.arange(2), None, 0, 3)  # every class from the start, 3 epochs
    return train_incremental(
        model_for(data, SETTINGS.seed),
        data,
        schedule,
        SETTINGS,
        lambda epoch: folder / f"epoch_{epoch:04d}.pt",
        save_every=2,
        progress=False,
    )


def test_a_transformer_trains_deterministically_and_is_read_back_as_trained(polarity, tmp_path):
    data = read_text_dataset(polarity)
    log = train(data, tmp_path / "a")
    train(data, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").glob("*.pt"))
    assert names == ["epoch_0000.pt", "epoch_0002.pt", "epoch_0003.pt"]
    for name in names:  # same seed, same batches: the same bytes
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert log["train_loss"].iloc[-1] < log["train_loss"].iloc[0], log  # (learning: the workflow test)

    # The checkpoint job builds the model from the same config mapping (vocabulary from the data)
    # and predicts what the trained weights predict.
    job = load_checkpoint_job(
        polarity, tmp_path / "a" / "epoch_0003.pt", {"hf": {"config": CONFIG}}, 3, device="cpu"
    )
    reference = model_for(data, 0)
    reference.load_state_dict(torch.load(tmp_path / "a" / "epoch_0003.pt", weights_only=True))
    reference.eval()
    with torch.no_grad():
        np.testing.assert_array_equal(job.model(**data.inputs("test")), reference(**data.inputs("test")))


def test_a_config_mapping_without_model_type_names_the_key():
    from epochlens.errors import ConfigError

    with pytest.raises(ConfigError, match="model.hf.config needs model_type"):
        build_hf_model({"hidden_size": 8}, vocab_size=10)
