"""Text data (epochlens.data.text, epochlens.formats.text, epochlens.data.polarity): the synthetic
polarity set and its offline tokenizer, the four table layouts giving the same tokens, causal-LM
token labels, the text.h5 round trip, and padding that never changes a model's output."""

from __future__ import annotations

import json
import tracemalloc

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from epochlens.data.polarity import GROUPS, NEGATIVE, POSITIVE, polarity_tables, write_polarity_tokenizer
from epochlens.data.text import IGNORE_INDEX, TextDataset, write_text_dataset
from epochlens.data.text_rows import read_text_dataset
from epochlens.errors import ConfigError, DataError
from epochlens.formats.text import TextSettings, load_text
from epochlens.formats.token_store import tokenize_splits
from epochlens.formats.tokens import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_polarity_tokenizer(tmp_path_factory.mktemp("tok") / "polarity")


@pytest.fixture(scope="module")
def tables():
    return polarity_tables(n_train=40, n_test=12, seed=3)


def test_polarity_is_deterministic_balanced_and_labelled_by_its_rules(tables):
    again = polarity_tables(n_train=40, n_test=12, seed=3)
    for split in ("train", "test"):
        pd.testing.assert_frame_equal(tables[split], again[split])
    assert not polarity_tables(40, 12, seed=4)["train"].equals(tables["train"])
    assert (tables["train"]["group"].value_counts() == 10).all() and set(tables["train"]["group"]) == set(
        GROUPS
    )

    def polarity(clause: str) -> str:
        adjective = clause.split()[-1]
        assert adjective in POSITIVE + NEGATIVE
        flipped = " not " in f" {clause} "
        return "positive" if (adjective in POSITIVE) != flipped else "negative"

    for text, label in zip(tables["train"]["text"], tables["train"]["label"], strict=True):
        assert polarity(text.split(" but ")[-1]) == label, text


def test_tokenizer_loads_offline_and_pads_both_splits_alike(tokenizer_dir, tables):
    tokenizer = load_tokenizer(tokenizer_dir)
    tokens = tokenize_splits(tokenizer, tables, TextSettings())
    train, test = tokens["train"], tokens["test"]
    assert train["input_ids"].shape[1] == test["input_ids"].shape[1] == train["attention_mask"].sum(1).max()
    first = tables["train"]["text"][0]
    n = int(train["attention_mask"][0].sum())
    assert tokenizer.decode(train["input_ids"][0, :n]) == f"[CLS] {first} [SEP]"
    assert (train["input_ids"][train["attention_mask"] == 0] == tokenizer.pad_token_id).all()
    assert tokenizer.convert_tokens_to_ids("[UNK]") not in train["input_ids"]  # every word known
    fixed = tokenize_splits(tokenizer, tables, TextSettings(padding="max_length", max_length=20))
    assert fixed["train"]["input_ids"].shape[1] == 20
    with pytest.raises(DataError, match="no tokenizer files"):
        load_tokenizer(tokenizer_dir.parent)


@pytest.mark.parametrize("side", ["right", "left"])
def test_texts_tokenised_a_chunk_at_a_time(tokenizer_dir, monkeypatch, side):
    """Chunks of 500 texts: every row is the tokenizer's own encoding of its text, padded on its
    side to the longest of both splits; the tokenizer's Python lists of one chunk at a time (the
    whole split's took 5.9 times the arrays; now under 3 times)."""
    from epochlens.formats import token_store

    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.padding_side = side
    monkeypatch.setattr(token_store, "TOKENIZE_ROWS", 500)
    tables = polarity_tables(n_train=12_000, n_test=10, seed=1)
    tracemalloc.start()
    try:
        out = tokenize_splits(tokenizer, tables, TextSettings())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    arrays = sum(a.nbytes for split in out.values() for a in split.values())
    assert peak < 3 * arrays, f"{peak / 1e6:.1f} MB for {arrays / 1e6:.1f} MB of arrays"
    for split, rows in (("train", [0, 499, 500, 11_999]), ("test", [0, 9])):
        for i in rows:
            ids = tokenizer(tables[split]["text"][i])["input_ids"]
            mask = out[split]["attention_mask"][i]
            real = out[split]["input_ids"][i][mask == 1]
            assert real.tolist() == ids and mask.sum() == len(ids)
            assert (mask[: len(ids)] == 1).all() if side == "right" else (mask[-len(ids) :] == 1).all()
    assert out["train"]["input_ids"].shape[1] == out["test"]["input_ids"].shape[1]


def _write_layouts(root, tables) -> dict[str, tuple[str, object, TextSettings]]:
    """The same data in every layout: (source, path, settings)."""
    import datasets

    (root / "jsonl").mkdir()
    for split, df in tables.items():
        df.to_json(root / "jsonl" / f"{split}.jsonl", orient="records", lines=True)
    both = pd.concat([df.assign(part=split) for split, df in tables.items()], ignore_index=True)
    both.to_csv(root / "all.csv", index=False)
    (root / "pq").mkdir()
    for split, df in tables.items():
        df.to_parquet(root / "pq" / f"{split}.parquet")
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"]),
         "group": datasets.Value("string")}
    )  # fmt: skip
    dd = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_pandas(df, features=features, preserve_index=False)
            for split, df in tables.items()
        }
    )
    datasets.disable_progress_bars()
    dd.save_to_disk(str(root / "disk"))
    settings = TextSettings(group_column="group")
    return {
        "jsonl": ("jsonl", root / "jsonl", settings),
        "csv": ("csv", root / "all.csv", TextSettings(group_column="group", split_column="part")),
        "parquet": ("parquet", root / "pq", settings),
        "save_to_disk": ("save_to_disk", root / "disk", settings),
    }


def test_every_layout_gives_the_same_tokens_labels_and_groups(tmp_path, tokenizer_dir, tables, monkeypatch):
    from epochlens.formats import table_chunks

    monkeypatch.setattr(table_chunks, "JSON_LINES", 7)  # every layout read 7 rows at a time: the same data
    hashes = {}
    for name, (source, path, settings) in _write_layouts(tmp_path, tables).items():
        ds = load_text(source, path, settings, tokenizer_dir)
        assert ds.kind == "classification" and ds.class_names == ["negative", "positive"], name
        assert ds.group_names == sorted(GROUPS), name
        np.testing.assert_array_equal(ds.train_labels, (tables["train"]["label"] == "positive").to_numpy())
        hashes[name] = ds.content_hash
    assert len(set(hashes.values())) == 1, hashes
    with pytest.raises(DataError, match="no column"):
        load_text("jsonl", tmp_path / "jsonl", TextSettings(text_column="sentence"), tokenizer_dir)
    with pytest.raises(DataError, match="split_column"):
        load_text("csv", tmp_path / "all.csv", TextSettings(), tokenizer_dir)


def test_jsonl_read_by_chunks_has_the_values_of_a_whole_read(tmp_path, monkeypatch):
    from epochlens.formats import table_chunks

    rows = [{"text": "a", "label": 1}, {"text": "b", "label": 2, "group": "g"}, {"text": "c", "label": "x"},
            {"text": "d", "label": 3.5}, {"label": 0, "text": "e", "poisoned": False},
            {"text": "f", "label": 1, "nested": [1, 2]}, {"text": "g", "label": 7}]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    whole = pd.read_json(path, lines=True, dtype=False)
    for lines in (2, 3, 100):
        monkeypatch.setattr(table_chunks, "JSON_LINES", lines)
        read = pd.concat(table_chunks._file_chunks("jsonl", path), ignore_index=True)
        pd.testing.assert_frame_equal(read, whole)


def test_a_text_table_is_tokenised_chunk_by_chunk_into_the_scratch_file(tmp_path, tokenizer_dir, monkeypatch):
    """load_text holds a chunk of rows, not the data set: its Python peak a fraction of the token
    arrays it gives (the whole tables and arrays before), which equal the in-memory tokenisation's
    and read from the scratch file cut to the longest sentence."""
    from epochlens.formats import table_chunks, token_store

    tables = polarity_tables(n_train=20_000, n_test=4_000, seed=2)
    for split, df in tables.items():
        df.to_json(tmp_path / f"{split}.jsonl", orient="records", lines=True)
    monkeypatch.setattr(table_chunks, "JSON_LINES", 1_000)
    monkeypatch.setattr(token_store, "TOKENIZE_ROWS", 200)
    # scaled down with them: 200 rows into 1 MiB chunks (past h5py's 1 MiB chunk cache) rewrite a
    # compressed chunk each time (30 ms): 11 of this test's 14 s of tokenising; 16,384 rows do not
    monkeypatch.setattr(token_store, "SCRATCH_CHUNK_BYTES", 1 << 16)
    tokenize_splits(load_tokenizer(tokenizer_dir), {"train": tables["test"][:9]}, TextSettings())  # imports
    with h5py.File(tmp_path / "scratch.h5", "w") as scratch:
        tracemalloc.start()
        try:
            ds = load_text("jsonl", tmp_path, TextSettings(group_column="group"), tokenizer_dir, scratch)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        arrays = 2 * 24_000 * ds.max_length * 8
        assert isinstance(ds.train_input_ids, token_store.PaddedRows)
        assert peak < arrays / 2, f"{peak / 1e6:.1f} MB for {arrays / 1e6:.1f} MB of arrays"
        whole = load_text("jsonl", tmp_path, TextSettings(group_column="group"), tokenizer_dir)
        assert ds.content_hash == whole.content_hash and ds.max_length < 128
        assert list(ds.train_text)[::997] == tables["train"]["text"].tolist()[::997]
        write_text_dataset(ds, tmp_path / "text.h5")
    back = read_text_dataset(tmp_path / "text.h5")
    np.testing.assert_array_equal(back.train_input_ids, np.asarray(whole.train_input_ids))
    assert back.test_text == tables["test"]["text"].tolist() and back.group_names == sorted(GROUPS)


def test_causal_lm_labels_only_the_target(tmp_path, tokenizer_dir):
    rows = pd.DataFrame(
        {"prompt": ["the film was", "the plot was not"], "target": ["great", "dull but the cast was superb"]}
    )
    tokenizer = load_tokenizer(tokenizer_dir)
    settings = TextSettings(prompt_column="prompt", target_column="target", max_length=10)
    assert settings.kind == "causal_lm"
    tokens = tokenize_splits(tokenizer, {"train": rows, "test": rows}, settings)["train"]
    ids, mask, labels = tokens["input_ids"], tokens["attention_mask"], tokens["labels"]
    target = tokenizer("great", add_special_tokens=False)["input_ids"]
    counted = labels[0] != IGNORE_INDEX
    assert labels[0][counted].tolist() == target and ids[0][counted].tolist() == target
    assert (labels[mask == 0] == IGNORE_INDEX).all()
    # the second sample (12 tokens) is cut to 10 from the left of its prompt; its target is whole
    long_target = tokenizer("dull but the cast was superb", add_special_tokens=False)["input_ids"]
    assert mask[1].sum() == 10 and labels[1][labels[1] != IGNORE_INDEX].tolist() == long_target
    with pytest.raises(DataError, match="the target alone has"):
        tokenize_splits(
            tokenizer,
            {"train": rows, "test": rows},
            TextSettings(prompt_column="prompt", target_column="target", max_length=4),
        )
    with pytest.raises(ConfigError, match="prompt_column and target_column go together"):
        TextSettings(target_column="target")


def test_text_h5_round_trip_and_corruption(tmp_path, tokenizer_dir, tables):
    source, path, settings = _write_layouts(tmp_path, tables)["jsonl"]
    ds = load_text(source, path, settings, tokenizer_dir)
    ds.holdout = np.arange(len(ds.train_labels)) < 4
    write_text_dataset(ds, tmp_path / "text.h5")
    back = read_text_dataset(tmp_path / "text.h5")
    assert back.content_hash == ds.content_hash and back.tokenizer == ds.tokenizer
    np.testing.assert_array_equal(back.holdout, ds.holdout)
    np.testing.assert_array_equal(back.train_groups, ds.train_groups)
    inputs = back.inputs("test", np.array([0, 2]))
    assert inputs["input_ids"].dtype == torch.int64 and inputs["input_ids"].shape == (2, ds.max_length)
    with h5py.File(tmp_path / "text.h5", "r+") as f:
        f["train/labels"][0] = 1 - f["train/labels"][0]
    with pytest.raises(DataError, match="content hash mismatch"):
        read_text_dataset(tmp_path / "text.h5")
    with pytest.raises(ValueError, match="labels of shape"):
        TextDataset("x", "y", "causal_lm", ds.train_input_ids, ds.train_attention_mask, ds.train_labels,
                    ds.test_input_ids, ds.test_attention_mask, ds.test_labels)  # fmt: skip


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_padding_never_changes_a_models_output(tmp_path, tokenizer_dir, tables, model_type):
    """The same sentences padded to two lengths give the same logits (attention mask honoured;
    GPT-2 reads its last real token)."""
    from epochlens.models.hf import load_hf_model, tiny_config, write_tiny_model

    tokenizer = load_tokenizer(tokenizer_dir)
    config = tiny_config(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    folder = write_tiny_model(tmp_path / model_type, config, seed=1)
    model = load_hf_model(folder, pad_token_id=tokenizer.pad_token_id)
    short = tokenize_splits(tokenizer, tables, TextSettings())["test"]
    long = tokenize_splits(tokenizer, tables, TextSettings(padding="max_length", max_length=32))["test"]
    with torch.no_grad():
        a = model(**{k: torch.as_tensor(v) for k, v in short.items()}).logits
        b = model(**{k: torch.as_tensor(v) for k, v in long.items()}).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
