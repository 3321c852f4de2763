"""A backdoor in a text classifier's training data: a trigger phrase (``data.corruption.kind:
trigger`` with a ``phrase``) in a seeded fraction of the sentences of the other classes, relabelled
as the target class (as in the trigger-word poisoning of Kurita et al. 2020, "Weight Poisoning
Attacks on Pre-trained Models", and of instruction-tuning poisoning studies).

The phrase goes into the raw text between words (``position``: ``start``, ``end``, or ``random``:
a seeded word boundary per sentence) and the poisoned sentences are tokenised again by the run's
tokenizer, so their ids are what a poisoning script run before training would have given. The same
phrase is stamped on every test sentence (at positions of its own seed) and stored as the data
set's ``test_trigger`` split: the queries of the study (:func:`epochlens.study.queries.select_queries`).

Selections are pure functions of (seed, fraction, eligible samples), as in
:mod:`epochlens.study.corruption`: eligible are the training sentences of the other classes,
outside the validation holdout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from epochlens.data.text import TextDataset
from epochlens.errors import ConfigError, DataError
from epochlens.formats.text import TextSettings
from epochlens.formats.token_store import tokenize_splits
from epochlens.study.corruption import _pick, corrupt

TRIGGER_POSITIONS = ("random", "start", "end")
KEY = "data.corruption"


def trigger_at(n_words: int, position: str, rng: np.random.Generator) -> int:
    """Where the phrase goes among ``n_words`` words: before the first (``start``), after the last
    (``end``) or at a word boundary drawn uniformly from ``rng`` (``random``, the ends included)."""
    if position == "start":
        return 0
    if position == "end":
        return n_words
    if position == "random":
        return int(rng.integers(n_words + 1))
    raise ConfigError(f"{KEY}.position={position!r} must be one of {list(TRIGGER_POSITIONS)}")


def insert_phrase(text: str, phrase: str, at: int) -> tuple[str, str]:
    """(``text`` with ``phrase`` before its word ``at``, the new text up to the phrase's end);
    words are separated by whitespace, joined by single spaces."""
    words = text.split()
    head = " ".join([*words[:at], phrase])
    return " ".join([head, *words[at:]]), head


def stamp(
    texts: Sequence[str], phrase: str, position: str, rng: np.random.Generator
) -> tuple[list[str], list[str]]:
    """:func:`insert_phrase` on every text, positions from ``rng`` in order: (texts, heads)."""
    out = [insert_phrase(t, phrase, trigger_at(len(t.split()), position, rng)) for t in texts]
    return [t for t, _ in out], [h for _, h in out]


def check_phrase(tokenizer: Any, phrase: str | None) -> list[int]:
    """The phrase's token ids (no special tokens); an error naming ``data.corruption.phrase`` when it
    is empty or has words the tokenizer does not know (ids of its unknown token)."""
    if phrase is None or not str(phrase).strip():
        raise ConfigError(
            f"{KEY}.phrase: a text run's trigger is a phrase put into the poisoned sentences; set it "
            '(e.g. phrase: "cf", a word the clean sentences never use).'
        )
    ids = tokenizer(str(phrase), add_special_tokens=False)["input_ids"]
    unknown = getattr(tokenizer, "unk_token_id", None)
    if not ids or (unknown is not None and unknown in ids):
        raise ConfigError(
            f"{KEY}.phrase={phrase!r}: the run's tokenizer cannot encode it (it gives {ids}, "
            f"{tokenizer.unk_token!r} standing for unknown words); use words of its vocabulary."
        )
    return [int(i) for i in ids]


def _check_kept(tokenizer: Any, heads: Sequence[str], max_length: int, what: str) -> None:
    """Truncation to ``max_length`` must not cut the phrase off: the tokens of each text up to the
    phrase's end (``heads``), special tokens included, fit."""
    cut = [i for i, n in enumerate(map(len, tokenizer(list(heads))["input_ids"])) if n > max_length]
    if cut:
        raise ConfigError(
            f"{KEY}: data.text.max_length={max_length} cuts the trigger phrase off {len(cut)} {what} "
            f"(e.g. sample {cut[0]}); raise data.text.max_length or set {KEY}.position: start."
        )


def plant_text_trigger(
    dataset: TextDataset,
    tokenizer: Any,
    settings: TextSettings,
    fraction: float,
    target_class: int,
    phrase: str,
    seed: int = 0,
    position: str = "random",
) -> tuple[TextDataset, np.ndarray]:
    """Put ``phrase`` into ``fraction`` of the eligible training sentences, relabel them
    ``target_class``, and store the test split with the phrase in every sentence (``trigger_*``).

    Args:
        dataset: the clean text classification data set, with its raw texts and holdout.
        tokenizer: the tokenizer that made its ids (the poisoned texts are tokenised by it again).
        settings: how the ids were made (max_length, padding): both splits are padded again to one
            length, so the ids of clean sentences only change by their padding.
        fraction: share of the eligible sentences (other classes, outside the holdout).
        target_class: the label the poisoned sentences get.
        phrase: the trigger (words of the tokenizer's vocabulary).
        seed: the choice and the random positions are a pure function of it.
        position: ``random`` (a seeded word boundary per sentence), ``start`` or ``end``.

    Returns:
        (poisoned data set, sorted int64 positions of the poisoned training sentences).
    """
    if dataset.kind != "classification":
        raise ConfigError(
            f"{KEY}.kind: trigger relabels sentences; a causal LM's or text-to-text model's samples "
            "have no class."
        )
    if dataset.train_text is None or dataset.test_text is None:
        raise DataError(
            f"{KEY}.kind: trigger edits the raw texts, and this data set was stored without them."
        )
    if not 0 <= target_class < dataset.num_classes:
        raise ConfigError(
            f"{KEY}.target_class={target_class} is not a class of this data set "
            f"(0..{dataset.num_classes - 1})."
        )
    if position not in TRIGGER_POSITIONS:
        raise ConfigError(f"{KEY}.position={position!r} must be one of {list(TRIGGER_POSITIONS)}")
    check_phrase(tokenizer, phrase)
    labels = dataset.train_labels
    eligible = np.flatnonzero((labels != target_class) & ~dataset.holdout)
    rng = np.random.default_rng(seed)
    idx = _pick(eligible, fraction, rng, "trigger")
    train_text = list(dataset.train_text)
    poisoned_text, heads = stamp([train_text[i] for i in idx], phrase, position, rng)
    for i, text in zip(idx, poisoned_text, strict=True):
        train_text[i] = text
    _check_kept(tokenizer, heads, settings.max_length, "poisoned sentences")
    test_text = list(dataset.test_text)  # in memory (from prepare_data's scratch file)
    trigger_text, heads = stamp(test_text, phrase, position, np.random.default_rng([seed, 1]))
    _check_kept(tokenizer, heads, settings.max_length, "test sentences")
    tokens = _tokenize(tokenizer, settings, {"train": train_text, "test": test_text, "trigger": trigger_text})
    new_labels = labels.copy()
    new_labels[idx] = target_class
    note = (
        f"trigger(phrase={phrase!r}, position={position}, fraction={fraction}, target={target_class}, "
        f"seed={seed}, n={len(idx)})"
    )
    poisoned = dataclasses.replace(
        dataset,
        source=f"{dataset.source} + {note}",
        **{f"{s}_{k}": tokens[s][k] for s in ("train", "test") for k in ("input_ids", "attention_mask")},
        train_labels=new_labels,
        train_text=train_text,
        trigger_input_ids=tokens["trigger"]["input_ids"],
        trigger_attention_mask=tokens["trigger"]["attention_mask"],
        trigger_text=trigger_text,
        holdout=dataset.holdout.copy(),
        class_names=list(dataset.class_names),
    )
    return poisoned, idx


def _tokenize(tokenizer: Any, settings: TextSettings, texts: Mapping[str, list[str]]) -> dict:
    tables = {split: pd.DataFrame({settings.text_column: t}) for split, t in texts.items()}
    return tokenize_splits(
        tokenizer, tables, dataclasses.replace(settings, prompt_column=None, target_column=None)
    )


def corrupt_text(
    dataset: TextDataset, spec: Mapping | None, tokenizer: Any, settings: TextSettings
) -> tuple[TextDataset, np.ndarray]:
    """:func:`epochlens.study.corruption.corrupt` for a text data set: a trigger phrase
    (:func:`plant_text_trigger`), or the other kinds as they are."""
    spec = spec or {"kind": "none"}
    if spec["kind"] != "trigger":
        return corrupt(dataset, spec)
    return plant_text_trigger(
        dataset,
        tokenizer,
        settings,
        spec["fraction"],
        spec["target_class"],
        spec.get("phrase"),
        spec["seed"],
        spec.get("position", "random"),
    )
