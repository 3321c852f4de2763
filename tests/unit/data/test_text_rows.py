"""A text run's dataset.h5 read by rows (epochlens.data.text_rows): the same tokens, hash and
numbers as the whole file read at once, and a job that reads only the chunks of its rows."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from epochlens.data import text as text_module
from epochlens.data import text_rows
from epochlens.data.rows import RowReader
from epochlens.data.text import TextDataset, TokenRows, write_text_dataset
from epochlens.data.text_rows import (
    StoredTextDataset,
    open_any_dataset,
    open_text_dataset,
    read_text_dataset,
    stored_strings,
)
from epochlens.errors import DataError

transformers = pytest.importorskip("transformers")
VOCAB, PAD, L, N = 40, 0, 9, 1000


def _tokens(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(1, L + 1, size=n)
    mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int64)
    return np.where(mask == 1, rng.integers(2, VOCAB, size=(n, L)), PAD), mask


def _dataset(seed: int = 0) -> TextDataset:
    rng = np.random.default_rng(seed)
    (train_ids, train_mask), (test_ids, test_mask) = _tokens(rng, N), _tokens(rng, 200)
    return TextDataset(
        name="rows", source="test", kind="classification",
        train_input_ids=train_ids, train_attention_mask=train_mask, train_labels=rng.integers(0, 2, N),
        test_input_ids=test_ids, test_attention_mask=test_mask, test_labels=rng.integers(0, 2, 200),
        num_classes=2, holdout=np.arange(N) < 40, pad_token_id=PAD, vocab_size=VOCAB,
        train_text=[f"s{i}" for i in range(N)], test_text=[f"t{i}" for i in range(200)],
    )  # fmt: skip


@pytest.fixture
def chunked(monkeypatch):
    """Chunks of 128 token rows (a million sentences' chunks hold thousands)."""
    monkeypatch.setattr(text_module, "TOKEN_CHUNK_BYTES", 128 * L * 8)


@pytest.fixture
def stored(tmp_path, chunked):
    write_text_dataset(_dataset(), tmp_path / "dataset.h5")
    return tmp_path / "dataset.h5"


def test_rows_equal_the_whole_file(stored):
    whole, rows = read_text_dataset(stored), open_any_dataset(stored)
    assert isinstance(rows, StoredTextDataset) and isinstance(rows.train_input_ids, RowReader)
    assert rows.content_hash == whole.content_hash == _dataset().content_hash
    assert rows.max_token_id() == whole.max_token_id() == int(_dataset().train_input_ids.max())
    assert np.array_equal(rows.lengths("train"), whole.lengths("train"))
    with h5py.File(stored) as f:
        assert f["train/input_ids"].chunks == (128, L)
    picked = np.array([900, 3, 3, 511, 128])
    for key, tensor in whole.inputs("train", picked).items():
        assert torch.equal(rows.inputs("train", picked)[key], tensor)
        lazy = rows.rows("train", np.arange(100, N))
        assert isinstance(lazy[key], TokenRows) and lazy[key].shape == (N - 100, L)
        assert torch.equal(lazy[key][picked[[0, 3, 4]] - 100], tensor[[0, 3, 4]])
        assert torch.equal(lazy[key].select(np.array([0, 800, 28]))[1:3], tensor[[0, 4]])
        assert torch.equal(lazy[key][-1], whole.inputs("train")[key][-1])


def test_a_data_loader_reads_a_batch_of_rows_at_once(stored):
    """Influence's training samples (a Dataset of dicts) read by rows: the batches of the file's
    tokens equal those of the tokens in memory."""
    from torch.utils.data import DataLoader, Subset

    from epochlens.influence.study_inputs import with_labels

    whole, rows = read_text_dataset(stored), open_text_dataset(stored)
    trained = np.flatnonzero(~whole.holdout)
    lazy = Subset(with_labels(rows.rows("train", trained), rows.train_labels[trained])[0], range(5, 300))
    eager = Subset(with_labels(whole.inputs("train", trained), whole.train_labels[trained])[0], range(5, 300))
    for a, b in zip(DataLoader(lazy, batch_size=64), DataLoader(eager, batch_size=64), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _damage_last_chunk(path, key: str) -> None:
    with h5py.File(path, "r") as f:
        info = f[key].id.get_chunk_info(f[key].id.get_num_chunks() - 1)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 8)
        fh.write(bytes(info.size - 16))


def test_a_text_job_reads_only_its_rows(tmp_path, chunked):
    """The evaluation (test split and holdout, rows 0..39) and the sample outputs of the first half
    of the training split run on a file whose last training chunk is damaged, and equal those on
    the intact file; reading the whole file names the file and the fix."""
    from epochlens.evaluation import evaluate_checkpoint
    from epochlens.models.outputs import attach_output_adapter
    from epochlens.samples.outputs import classifier_outputs
    from epochlens.schedule import ClassSchedule

    for name in ("intact.h5", "dataset.h5"):
        write_text_dataset(_dataset(), tmp_path / name)
    _damage_last_chunk(tmp_path / "dataset.h5", "train/input_ids")
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=32, num_labels=2, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    attach_output_adapter(model, "logits")
    schedule, active = ClassSchedule(np.arange(2), 2, 0, 10), np.arange(2)
    tables, outputs = [], []
    for name in ("intact.h5", "dataset.h5"):
        data = open_text_dataset(tmp_path / name)
        tables.append(evaluate_checkpoint(model, data, schedule, 10, batch_size=64))
        half = data.rows("train", np.arange(N // 2))
        outputs.append(classifier_outputs(model, half, data.train_labels[: N // 2], active, 64, "cpu"))
    assert set(tables[1]["split"]) == {"test", "holdout"} and tables[0].equals(tables[1])
    assert all(np.array_equal(outputs[0][k], outputs[1][k]) for k in outputs[0])
    with pytest.raises(DataError, match=r"dataset.h5.*damaged.*prepare_data"):
        open_text_dataset(tmp_path / "dataset.h5").rows("train")["input_ids"][N - 1 :]
    with pytest.raises(DataError, match="prepare_data"):
        read_text_dataset(tmp_path / "dataset.h5")


def test_a_copy_with_other_tokens_is_hashed_again(stored):
    import dataclasses

    data = open_text_dataset(stored)
    ids = np.asarray(data.test_input_ids)
    other = dataclasses.replace(data, test_input_ids=np.where(ids > 2, ids - 1, ids))
    assert other.content_hash != data.content_hash
    whole = dataclasses.replace(read_text_dataset(stored), test_input_ids=other.test_input_ids)
    assert other.content_hash == whole.content_hash


def test_an_incomplete_file_names_the_fix(tmp_path):
    path = tmp_path / "dataset.h5"
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "epochlens-text-1"
    with pytest.raises(DataError, match=r"dataset.h5: not a complete.*prepare_data"):
        open_text_dataset(path)


def test_a_file_written_before_is_read_as_it_is(stored):
    """A text.h5 of the previous version (auto chunks, no largest token id stored): the same
    tokens, the largest id read by rows."""
    with h5py.File(stored, "a") as f:
        del f.attrs["max_token_id"]
        ids = f["train/input_ids"][()]
        del f["train/input_ids"]
        f["train"].create_dataset("input_ids", data=ids, compression="gzip")  # h5py's own chunks
    data = open_text_dataset(stored)
    assert data.stored_max_token_id is None and data.max_token_id() == int(ids.max())
    assert torch.equal(data.rows("train")["input_ids"][[999, 0]], torch.from_numpy(ids[[999, 0]]))
    assert data.content_hash == read_text_dataset(stored).content_hash


@pytest.mark.parametrize("spread_rows", [4096, 0])
def test_strings_of_rows_far_apart_are_read_alone(stored, monkeypatch, spread_rows):
    monkeypatch.setattr(text_rows, "SPREAD_ROWS", spread_rows)  # 0: rows 3 and 500 read alone
    texts = _dataset().train_text
    for positions in ([999, 3, 3, 500], [10, 11, 12], [], [0]):
        got = stored_strings(stored, "train/text", np.array(positions, np.int64))
        assert got == [texts[p] for p in positions]
    assert stored_strings(stored, "train/text") == texts and stored_strings(stored, "train/none") is None


def test_a_causal_lms_token_labels_stay_in_the_file_and_its_outputs_read_them_by_batch(tmp_path, monkeypatch):
    """Token labels (N, L) are read by rows like the ids (they were read whole at open): numpy's
    reads of them (a boolean mask, rows and columns) give the in-memory values, the sample classes
    read none, and a causal LM's sample outputs equal the in-memory data's, reading by batch."""
    from epochlens.models.outputs import attach_output_adapter
    from epochlens.outcome import IGNORE_INDEX, sample_classes
    from epochlens.samples.outputs import sequence_outputs

    base = _dataset()
    lm_labels = {s: np.where(np.arange(L) >= 2, base.labels(s)[:, None] * 0 + getattr(base, f"{s}_input_ids"),
                             IGNORE_INDEX) for s in ("train", "test")}  # fmt: skip
    lm = TextDataset(**{**base.__dict__, "kind": "causal_lm", "num_classes": 0, "class_names": [],
                        "train_labels": lm_labels["train"], "test_labels": lm_labels["test"]})  # fmt: skip
    write_text_dataset(lm, tmp_path / "dataset.h5")
    data = open_text_dataset(tmp_path / "dataset.h5")
    labels = data.train_labels
    assert isinstance(labels, RowReader) and data.content_hash == lm.content_hash
    mask = np.arange(N) % 3 == 0
    np.testing.assert_array_equal(labels[mask], lm.train_labels[mask])
    np.testing.assert_array_equal(labels[np.array([5, 1, 5]), 2:], lm.train_labels[[5, 1, 5], 2:])
    np.testing.assert_array_equal(labels[7, :4], lm.train_labels[7, :4])
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=L, n_embd=16, n_layer=1, n_head=2,
                                      bos_token_id=1, eos_token_id=1)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    attach_output_adapter(model)  # logits out, as a job's model gives them
    whole = sequence_outputs(model, lm.rows("train"), lm.train_labels, 64, "cpu")

    def unread(*_):
        raise AssertionError("token labels read whole")

    monkeypatch.setattr(RowReader, "__array__", unread)
    assert (sample_classes(labels) == 0).all()
    by_rows = sequence_outputs(model, data.rows("train"), TokenRows(labels), 64, "cpu")
    for key, values in whole.items():
        np.testing.assert_array_equal(by_rows[key], values, err_msg=key)
