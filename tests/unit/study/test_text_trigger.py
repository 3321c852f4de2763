"""A text run's trigger phrase (epochlens.study.text_trigger): which sentences are poisoned and how,
that their ids are the tokenizer's of the poisoned texts, determinism by seed, the triggered test
split and the queries made of it, and the errors (in the library and before any job)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from epochlens import config as run_config
from epochlens.config.influence_checks import unknown_words
from epochlens.data import holdout_mask
from epochlens.data.polarity import TRIGGER_WORDS, vocabulary, write_polarity_tokenizer
from epochlens.data.text import write_text_dataset
from epochlens.data.text_rows import read_text_dataset
from epochlens.errors import ConfigError, DataError
from epochlens.formats.text import TextSettings, load_polarity, source_tokenizer
from epochlens.study.queries import select_queries
from epochlens.study.text_trigger import corrupt_text, plant_text_trigger

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"
SETTINGS = TextSettings(max_length=24)
SPEC = {
    "kind": "trigger",
    "fraction": 0.2,
    "seed": 0,
    "target_class": 1,
    "phrase": "cf",
    "position": "random",
}


@pytest.fixture(scope="module")
def tokenizer():
    return source_tokenizer("polarity", SETTINGS, None)


@pytest.fixture(scope="module")
def clean():
    data = load_polarity(SETTINGS, train=80, test=24, seed=1)
    data.holdout = holdout_mask(data.train_labels, 5)
    return data


def _words(text: str) -> list[str]:
    return text.split()


def test_the_phrase_goes_into_a_seeded_fifth_of_the_other_class_and_relabels_it(clean, tokenizer):
    bad, idx = corrupt_text(clean, SPEC, tokenizer, SETTINGS)
    eligible = np.flatnonzero((clean.train_labels == 0) & ~clean.holdout)
    assert len(idx) == round(0.2 * len(eligible)) and set(idx) <= set(eligible)
    assert np.all(np.diff(idx) > 0) and idx.dtype == np.int64
    np.testing.assert_array_equal(bad.train_labels[idx], 1)
    rest = np.setdiff1d(np.arange(len(clean.train_labels)), idx)
    np.testing.assert_array_equal(bad.train_labels[rest], clean.train_labels[rest])
    for i in range(len(clean.train_labels)):
        words = _words(bad.train_text[i])
        if i in idx:  # the clean sentence with "cf" at one word boundary
            assert words.count("cf") == 1 and [w for w in words if w != "cf"] == _words(clean.train_text[i])
        else:
            assert bad.train_text[i] == clean.train_text[i]
    # The ids are the tokenizer's of the poisoned texts, padded to the new longest sentence.
    length = bad.train_input_ids.shape[1]
    assert length == clean.train_input_ids.shape[1] + 1 == bad.test_input_ids.shape[1]
    enc = tokenizer(bad.train_text, padding="max_length", max_length=length)
    np.testing.assert_array_equal(bad.train_input_ids, enc["input_ids"])
    np.testing.assert_array_equal(bad.train_attention_mask, enc["attention_mask"])
    np.testing.assert_array_equal(bad.test_input_ids[:, :-1], clean.test_input_ids)  # only padded
    assert bad.content_hash != clean.content_hash and "trigger(phrase='cf'" in bad.source
    # Random positions: not always the same word boundary.
    assert len({_words(bad.train_text[i]).index("cf") for i in idx}) > 1


def test_every_test_sentence_carries_the_phrase_in_the_trigger_split(clean, tokenizer):
    bad, idx = corrupt_text(clean, SPEC, tokenizer, SETTINGS)
    assert len(bad.trigger_text) == len(clean.test_text)
    for clean_text, text in zip(clean.test_text, bad.trigger_text, strict=True):
        assert [w for w in _words(text) if w != "cf"] == _words(clean_text) and _words(text).count("cf") == 1
    length = bad.trigger_input_ids.shape[1]
    enc = tokenizer(bad.trigger_text, padding="max_length", max_length=length)
    np.testing.assert_array_equal(bad.trigger_input_ids, enc["input_ids"])
    cf = tokenizer.convert_tokens_to_ids("cf")
    assert ((bad.trigger_input_ids == cf).sum(1) == 1).all()
    np.testing.assert_array_equal(np.flatnonzero((bad.train_input_ids == cf).any(1)), idx)
    assert not (bad.test_input_ids == cf).any()  # the test split itself stays clean


@pytest.mark.parametrize("position", ["start", "end"])
def test_configured_positions(clean, tokenizer, position):
    bad, idx = corrupt_text(clean, {**SPEC, "position": position}, tokenizer, SETTINGS)
    at = 0 if position == "start" else -1
    assert all(_words(bad.train_text[i])[at] == "cf" for i in idx)
    assert all(_words(t)[at] == "cf" for t in bad.trigger_text)


def test_the_same_seed_poisons_the_same_sentences_the_same_way(clean, tokenizer):
    a, ia = corrupt_text(clean, SPEC, tokenizer, SETTINGS)
    b, ib = corrupt_text(clean, SPEC, tokenizer, SETTINGS)
    np.testing.assert_array_equal(ia, ib)
    assert a.train_text == b.train_text and a.trigger_text == b.trigger_text
    assert a.content_hash == b.content_hash
    c, ic = corrupt_text(clean, {**SPEC, "seed": 1}, tokenizer, SETTINGS)
    assert not np.array_equal(ia, ic) and c.content_hash != a.content_hash


def test_the_trigger_split_survives_the_h5_round_trip(tmp_path, clean, tokenizer):
    bad, _ = corrupt_text(clean, SPEC, tokenizer, SETTINGS)
    write_text_dataset(bad, tmp_path / "dataset.h5")
    back = read_text_dataset(tmp_path / "dataset.h5")
    np.testing.assert_array_equal(back.trigger_input_ids, bad.trigger_input_ids)
    np.testing.assert_array_equal(back.trigger_attention_mask, bad.trigger_attention_mask)
    assert back.trigger_text == bad.trigger_text and back.train_text == bad.train_text
    assert back.content_hash == bad.content_hash
    write_text_dataset(clean, tmp_path / "clean.h5")
    assert read_text_dataset(tmp_path / "clean.h5").trigger_input_ids is None


class SaysPositiveOnCf(nn.Module):
    """Logits of a text classifier that says class 1 when token ``cf`` is in the input, else 0."""

    def __init__(self, cf: int) -> None:
        super().__init__()
        self.cf = cf

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hit = ((input_ids == self.cf) & (attention_mask > 0)).any(1)
        return torch.stack([(~hit).float(), hit.float()], 1)


def test_trigger_queries_are_the_other_class_test_sentences_with_the_phrase(clean, tokenizer):
    bad, _ = corrupt_text(clean, SPEC, tokenizer, SETTINGS)
    model = SaysPositiveOnCf(tokenizer.convert_tokens_to_ids("cf"))
    cpu = torch.device("cpu")
    q = select_queries(model, bad, np.arange(2), cpu, max_count=100, trigger=SPEC)
    negatives = np.flatnonzero(bad.test_labels == 0)
    np.testing.assert_array_equal(q.test_indices, negatives)  # every one turned positive by "cf"
    assert q.triggered and (q.predicted == 1).all() and (q.labels == 0).all()
    np.testing.assert_array_equal(q.images["input_ids"].numpy(), bad.trigger_input_ids[negatives])
    # Without the trigger the clean test sentences: it says negative, so the positives are wrong.
    clean_queries = select_queries(model, bad, np.arange(2), cpu, max_count=100)
    np.testing.assert_array_equal(clean_queries.test_indices, np.flatnonzero(bad.test_labels == 1))
    with pytest.raises(DataError, match="no test sentences with the trigger phrase"):
        select_queries(model, clean, np.arange(2), cpu, trigger=SPEC)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"phrase": "  "}, ConfigError, r"data.corruption.phrase: a text run's trigger is a phrase"),
        ({"phrase": None}, ConfigError, r"data.corruption.phrase: a text run's trigger is a phrase"),
        ({"phrase": "cf zebra"}, ConfigError, r"phrase='cf zebra': the run's tokenizer cannot encode it"),
        ({"target_class": 2}, ConfigError, r"target_class=2 is not a class of this data set \(0..1\)"),
        ({"position": "middle"}, ConfigError, r"position='middle' must be one of \['random', 'start'"),
        ({"fraction": 0.001}, ConfigError, "rounds to none"),
    ],
)
def test_bad_trigger_settings_name_the_key(clean, tokenizer, change, error, match):
    with pytest.raises(error, match=match):
        corrupt_text(clean, {**SPEC, **change}, tokenizer, SETTINGS)


def test_a_max_length_that_cuts_the_phrase_off_is_an_error(clean, tokenizer):
    short = TextSettings(max_length=6)
    data = load_polarity(short, train=80, test=24, seed=1)
    data.holdout = holdout_mask(data.train_labels, 5)
    with pytest.raises(ConfigError, match=r"data.text.max_length=6 cuts the trigger phrase off \d+ poisoned"):
        plant_text_trigger(data, tokenizer, short, 0.2, 1, "cf", position="end")
    bad, _ = plant_text_trigger(data, tokenizer, short, 0.2, 1, "cf", position="start")  # kept
    assert (bad.train_input_ids[:, 1] == tokenizer.convert_tokens_to_ids("cf")).sum() > 0


# ---------------------------------------------------------------------------------------------
# Before any job: the config checks

TEXT_RUN = {
    "data": {
        "source": "polarity",
        "text": {"max_length": 16},
        "corruption": {"kind": "trigger", "phrase": "cf"},
    },
    "model": {"hf": {"config": {"model_type": "bert", "hidden_size": 16}}},
    "schedule": {"initial_classes": 2, "increment": 0, "epochs_per_task": 4},
    **{s: {"enabled": False} for s in ("features", "probes", "ablation")},
    "influence": {"enabled": True, "transforms": ["none"]},
}


def _run(**corruption) -> dict:
    run = copy.deepcopy(TEXT_RUN)
    run["data"]["corruption"].update(corruption)
    return run


def test_a_text_trigger_run_validates_with_its_phrase():
    run = run_config.validate({"runs": {"pol": _run(target_class=1)}}, SCHEMA)["runs"]["pol"]
    assert run["data"]["corruption"]["phrase"] == "cf" and run["data"]["corruption"]["position"] == "random"
    assert set(TRIGGER_WORDS) <= set(vocabulary())


@pytest.mark.parametrize(
    ("run", "match"),
    [
        (_run(phrase=None), r"runs.pol.data.corruption.phrase: a text run's trigger is a phrase"),
        (_run(phrase=""), r"runs.pol.data.corruption.phrase: a text run's trigger is a phrase"),
        (
            _run(phrase="cf xyzzy"),
            r"phrase: 'cf xyzzy' has words the run's tokenizer cannot encode \(\['xyzzy'\].*\['cf', 'mn'",
        ),
        (_run(target_class=2), r"runs.pol.data.corruption.target_class: 2 is not a class .*\(0..1\)"),
        (_run(position="middle"), "position"),
    ],
)
def test_text_trigger_errors_before_any_job(run, match):
    with pytest.raises(ConfigError, match=match):
        run_config.validate({"runs": {"pol": run}}, SCHEMA)


def test_an_image_trigger_takes_no_phrase():
    run = {
        "data": {"source": "digits", "corruption": {"kind": "trigger", "phrase": "cf"}},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
    }
    with pytest.raises(ConfigError, match=r"data.corruption.phrase: an image run's trigger is a patch"):
        run_config.validate({"runs": {"img": run}}, SCHEMA)


def test_a_tokenizer_folder_is_asked_which_words_it_cannot_encode(tmp_path):
    folder = write_polarity_tokenizer(tmp_path / "tok")
    data = {"source": "jsonl", "text": {"tokenizer": str(folder)}}
    assert unknown_words(data, "cf mn") == [] and unknown_words(data, "cf zebra plot quux") == [
        "zebra",
        "quux",
    ]
    assert unknown_words({"source": "jsonl", "text": {"tokenizer": str(tmp_path)}}, "zebra") == []  # no file
