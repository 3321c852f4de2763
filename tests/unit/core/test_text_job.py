"""A text run's checkpoint job: a Hugging Face classifier read from its checkpoint folder with the
tokenised data set, evaluated per class and per data group against the model's own predictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.data.polarity import polarity_tables, vocabulary, write_polarity_tokenizer
from epochlens.data.text import is_text_dataset, write_text_dataset
from epochlens.evaluation import evaluate_checkpoint, group_table
from epochlens.formats.text import TextSettings, load_text
from epochlens.job import load_checkpoint_job
from epochlens.models.hf import load_hf_model, tiny_config, write_tiny_model
from epochlens.schedule import NO_SCHEDULE


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_a_transformer_checkpoint_is_evaluated_per_class_and_group(tmp_path, model_type):
    tokenizer_dir = write_polarity_tokenizer(tmp_path / "tokenizer")
    tables = polarity_tables(n_train=24, n_test=40, seed=1)
    (tmp_path / "data").mkdir()
    for split, df in tables.items():
        df.to_json(tmp_path / "data" / f"{split}.jsonl", orient="records", lines=True)
    data = load_text("jsonl", tmp_path / "data", TextSettings(group_column="group"), tokenizer_dir)
    write_text_dataset(data, tmp_path / "text.h5")
    assert is_text_dataset(tmp_path / "text.h5")
    config = tiny_config(model_type, vocab_size=len(vocabulary()), pad_token_id=data.pad_token_id)
    folder = write_tiny_model(tmp_path / "run" / "checkpoint-10", config, seed=2)
    np.save(tmp_path / "class_order.npy", np.array([0, 1]))

    job = load_checkpoint_job(
        tmp_path / "text.h5", folder, {"hf": {"task": "sequence_classification"}}, 10, "cpu",
        tmp_path / "class_order.npy", dict(NO_SCHEDULE),
    )  # fmt: skip
    assert job.active.tolist() == [0, 1]
    table = evaluate_checkpoint(job.model, job.data, job.schedule, job.epoch, batch_size=16)
    test = table[table["split"] == "test"]

    reference = load_hf_model(folder, pad_token_id=data.pad_token_id)  # the model as transformers runs it
    with torch.no_grad():
        predicted = reference(**data.inputs("test")).logits.argmax(1).numpy()
    correct = predicted == data.test_labels
    for (class_id, group), row in test.set_index(["class_id", "data_group"]).iterrows():
        in_cell = (data.test_labels == class_id) & (np.array(data.group_names)[data.test_groups] == group)
        assert row["n"] == in_cell.sum() and row["n_correct"] == correct[in_cell].sum()
    assert set(test["data_group"]) == {"plain", "intensified", "negated", "contrast"}
    assert group_table(table.assign(index=0))["n"].sum() == len(data.test_labels)  # holdout: none


def test_data_from_another_tokenizer_is_refused_naming_the_fix(tmp_path):
    """Token ids beyond the model's embeddings: a clear error, not an IndexError deep in the model."""
    from epochlens.errors import CheckpointError
    from epochlens.formats.text import load_polarity
    from epochlens.models.hf import build_hf_model

    data = load_polarity(TextSettings(max_length=16), train=16, test=8)
    small = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 16, "vocab_size": 10}  # fmt: skip
    model = build_hf_model(small, "sequence_classification", 2, data.pad_token_id)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    write_text_dataset(data, tmp_path / "dataset.h5")
    job = load_checkpoint_job(
        tmp_path / "dataset.h5", tmp_path / "weights.pt", {"hf": {"config": small}}, 0, "cpu"
    )
    with pytest.raises(CheckpointError, match=r"token ids reach \d+ but the model has 10 token embeddings"):
        job.model  # noqa: B018
