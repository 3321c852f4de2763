"""Tokenised text data sets: what a text run's jobs read, as :class:`epochlens.data.Dataset` is for
images (torch-free but for :meth:`TextDataset.inputs`).

A :class:`TextDataset` holds each split's token ids and attention mask (N, L), padded to one length
L, and class labels (N,) (``kind`` classification), token labels (N, L) (``causal_lm``: the ids to
predict, -100 on the prompt and the padding, as Hugging Face's causal LMs expect) or an
encoder-decoder's labels (N, T) (``text_to_text``: the target's ids ending with eos, -100 on the
padding; :meth:`TextDataset.inputs` carry them: the model builds its decoder inputs from them, as
transformers does in training). Optional per-sample groups (e.g. the prompt set) work as for
images. The tokenizer that made the ids is named and fingerprinted: its change is a change of data.

``text.h5`` layout (:func:`write_text_dataset`): ``train/`` and ``test/`` with ``input_ids``,
``attention_mask``, ``labels`` (and ``groups``, and the raw ``text`` for tables and figures),
``train/holdout`` (and ``train/ground_truth``, your poisoned samples; ``test_trigger/``: the test
split with a trigger phrase in every sentence, :mod:`epochlens.study.text_trigger`), attributes
``kind``, ``num_classes``, ``class_names``, ``group_names``, ``tokenizer``, ``pad_token_id``,
``vocab_size``, ``content_hash``, ``max_token_id``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import h5py
import numpy as np

from epochlens.atomic_hdf5 import atomic_h5
from epochlens.data.blocks import BLOCK_BYTES, copy_rows, update_hash
from epochlens.data.rows import RowReader, int_positions

if TYPE_CHECKING:
    import torch


TEXT_KINDS = ("classification", "causal_lm", "text_to_text")
#: Kinds whose labels are token labels (N, L) or (N, T): no classes, loss over the target tokens.
TOKEN_KINDS = ("causal_lm", "text_to_text")
IGNORE_INDEX = -100  # token labels that no loss counts (Hugging Face's convention)


@dataclass
class TextDataset:
    """Token ids, masks and labels of a train and a test split."""

    name: str
    source: str
    kind: Literal["classification", "causal_lm", "text_to_text"]
    train_input_ids: np.ndarray  # (N, L) int64 (text_to_text: the encoder's)
    train_attention_mask: np.ndarray  # (N, L) int64, 1 = a real token
    train_labels: np.ndarray  # (N,) int64 class ids, (N, L) token labels, or (N, T) decoder labels
    test_input_ids: np.ndarray
    test_attention_mask: np.ndarray
    test_labels: np.ndarray
    num_classes: int = 0  # classification: the classes; causal_lm and text_to_text: 0
    class_names: list[str] = field(default_factory=list)
    holdout: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    train_groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None
    group_names: list[str] = field(default_factory=list)
    tokenizer: str = ""  # "<name or folder> sha256:<fingerprint of its files>"
    pad_token_id: int = 0  # the tokenizer's (a GPT-2-style classifier reads its last non-pad token)
    vocab_size: int = 0  # the tokenizer's (a model trained from a config gets this many embeddings)
    train_text: list[str] | None = None  # the raw texts, for tables and figures (not hashed)
    test_text: list[str] | None = None
    # Your ground truth (data.ground_truth): (N_train,) bool, True for each poisoned training
    # sample; None without one (not hashed).
    ground_truth: np.ndarray | None = None
    # The test split with data.corruption's trigger phrase in every sentence (a backdoor study's
    # queries: epochlens.study.text_trigger): (N_test, L) ids and mask, and the texts; None without.
    trigger_input_ids: np.ndarray | None = None
    trigger_attention_mask: np.ndarray | None = None
    trigger_text: list[str] | None = None

    #: Text labels are class ids or token labels, never regression targets.
    is_regression = False

    def __post_init__(self) -> None:
        if self.kind not in TEXT_KINDS:
            raise ValueError(f"kind must be one of {TEXT_KINDS}, not {self.kind!r}")
        for split in ("train", "test"):
            self._check_split(split)
        self._check_texts_and_lengths()
        if len(self.holdout) == 0:
            self.holdout = np.zeros(len(self.train_input_ids), dtype=bool)
        if self.kind == "classification" and not self.class_names:
            self.class_names = [str(c) for c in range(self.num_classes)]
        self._check_trigger()
        if (self.train_groups is None) != (self.test_groups is None):
            raise ValueError("train_groups and test_groups must both be given or both be None")
        if self.train_groups is not None:
            self.train_groups = np.asarray(self.train_groups, dtype=np.int64)
            self.test_groups = np.asarray(self.test_groups, dtype=np.int64)

    def _check_split(self, split: str) -> None:
        """A split's ids, mask (N, L) and labels (shaped for the kind), stored as int64 (ids and
        masks read by rows from a file, :mod:`epochlens.data.text_rows`, left there)."""
        ids, mask = (_int64(getattr(self, f"{split}_{key}")) for key in ("input_ids", "attention_mask"))
        labels = _int64(getattr(self, f"{split}_labels"))
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise ValueError(f"{split}: input_ids {ids.shape} and attention_mask {mask.shape} must be (N, L)")
        want = {"causal_lm": ids.shape, "classification": ids.shape[:1]}.get(self.kind)
        if want is None:  # text_to_text: decoder labels of their own length T
            want = (len(ids), labels.shape[1] if labels.ndim == 2 else -1)
        if labels.shape != want:
            raise ValueError(f"{split}: labels of shape {labels.shape}, expected {want} for {self.kind}")
        setattr(self, f"{split}_input_ids", ids)
        setattr(self, f"{split}_attention_mask", mask)
        setattr(self, f"{split}_labels", labels)

    def _check_texts_and_lengths(self) -> None:
        """A text per sample where texts are given; both splits padded to one length."""
        for split in ("train", "test"):
            texts = getattr(self, f"{split}_text")
            if texts is not None and len(texts) != len(getattr(self, f"{split}_input_ids")):
                raise ValueError(
                    f"{split}: {len(texts)} texts for {len(getattr(self, f'{split}_input_ids'))} samples"
                )
        if self.train_input_ids.shape[1] != self.test_input_ids.shape[1]:
            raise ValueError("train and test must be padded to the same length")
        if self.kind == "text_to_text" and self.train_labels.shape[1] != self.test_labels.shape[1]:
            raise ValueError("train and test decoder labels must be padded to the same length")

    def _check_trigger(self) -> None:
        """The triggered test split, where given: int64, shaped as the test split."""
        if self.trigger_input_ids is None:
            return
        self.trigger_input_ids = np.asarray(self.trigger_input_ids, dtype=np.int64)
        self.trigger_attention_mask = np.asarray(self.trigger_attention_mask, dtype=np.int64)
        if self.trigger_input_ids.shape != self.test_input_ids.shape or (
            self.trigger_attention_mask.shape != self.trigger_input_ids.shape
        ):
            raise ValueError(
                f"trigger_input_ids {self.trigger_input_ids.shape} and trigger_attention_mask "
                f"{self.trigger_attention_mask.shape} must be shaped as test_input_ids "
                f"{self.test_input_ids.shape}"
            )

    @property
    def token_labels(self) -> bool:
        """Whether the labels are a sequence model's target tokens (causal LM, text-to-text)."""
        return self.kind in TOKEN_KINDS

    @property
    def max_length(self) -> int:
        return int(self.train_input_ids.shape[1])

    @property
    def content_hash(self) -> str:
        """SHA-256 of what the numbers depend on: ids, masks, labels, groups, tokenizer fingerprint."""
        h = hashlib.sha256(f"{self.kind}|{self.tokenizer}".encode())
        keys = ("input_ids", "attention_mask", "labels")
        arrays = [getattr(self, f"{s}_{k}") for s in ("train", "test") for k in keys]
        if self.train_groups is not None:
            arrays += [self.train_groups, self.test_groups]
            h.update(json.dumps(self.group_names).encode())
        if self.trigger_input_ids is not None:  # the triggered queries (absent: the hash as before)
            arrays += [self.trigger_input_ids, self.trigger_attention_mask]
        for arr in arrays:
            update_hash(h, arr)
        return h.hexdigest()

    def labels(self, split: str) -> np.ndarray:
        return self.train_labels if _check_split(split) == "train" else self.test_labels

    def groups(self, split: str) -> np.ndarray | None:
        return self.train_groups if _check_split(split) == "train" else self.test_groups

    def inputs(self, split: str, indices: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """``{"input_ids", "attention_mask"}`` (N, L) int64 tensors of ``split``: a model's keyword
        arguments (``model(**inputs)``), as batches of :mod:`epochlens.batches` carry them; a
        text-to-text model's also ``labels`` (N, T), from which it builds its decoder inputs."""
        import torch  # here: tables and figures read text data sets without torch

        return {
            key: torch.from_numpy(np.ascontiguousarray(a if indices is None else a[indices]))
            for key, a in self._model_arrays(split).items()
        }

    def rows(self, split: str, indices: np.ndarray | None = None) -> dict[str, TokenRows]:
        """:meth:`inputs` read a batch at a time when indexed (:class:`TokenRows`): for a stage
        that would otherwise hold the whole split."""
        return {key: TokenRows(a, indices) for key, a in self._model_arrays(split).items()}

    def _model_arrays(self, split: str) -> dict:
        """The arrays of ``split`` a model takes: ids and mask (a text-to-text model's labels too)."""
        keys = ["input_ids", "attention_mask"]
        arrays = {key: getattr(self, f"{_check_split(split)}_{key}") for key in keys}
        return arrays | ({"labels": self.labels(split)} if self.kind == "text_to_text" else {})

    def max_token_id(self) -> int:
        """The largest token id of both splits, read a block of rows at a time."""
        return max(_blocks(getattr(self, f"{s}_input_ids"), lambda b: int(b.max(initial=0)), max)
                   for s in ("train", "test"))  # fmt: skip

    def texts(self, split: str) -> list[str] | None:
        """The raw texts of ``split`` (None when the data set was written without them)."""
        return self.train_text if _check_split(split) == "train" else self.test_text

    def lengths(self, split: str) -> np.ndarray:
        """(N,) number of real (non-padding) tokens of every sample."""
        mask = getattr(self, f"{_check_split(split)}_attention_mask")
        return _blocks(mask, lambda b: b.sum(axis=1), lambda *p: np.concatenate(p), np.zeros(0, np.int64))


class TokenRows:
    """Rows ``indices`` of an (N, L) int array (a :class:`RowReader` or in memory) as a read-only
    int64 tensor that reads its rows when indexed: ``rows[a:b]``, ``rows[positions]`` (an int
    array, list or tensor) give a tensor of those rows, ``rows.select(positions)`` picks rows
    without reading any."""

    def __init__(self, array, indices: np.ndarray | None = None):
        import torch

        self.array = array
        self.indices = np.arange(len(array)) if indices is None else np.asarray(indices, np.int64)
        self.shape = (len(self.indices), *array.shape[1:])
        self.ndim, self.dtype = len(self.shape), torch.int64

    def __len__(self) -> int:
        return len(self.indices)

    def is_floating_point(self) -> bool:
        return False

    def select(self, positions) -> TokenRows:
        return TokenRows(self.array, self.indices[int_positions(positions)])

    def __getitem__(self, key) -> torch.Tensor:
        import torch

        if isinstance(key, (int, np.integer)):
            return self[[key]][0]
        rows = self.indices[key if isinstance(key, slice) else int_positions(key)]
        return torch.from_numpy(np.ascontiguousarray(self.array[rows], dtype=np.int64))

    __getitems__ = __getitem__  # a list of positions: a torch Dataset's batch in one read


def _int64(array):
    """``array`` as int64 in memory, or left as it is when it reads its rows from a file."""
    return array if isinstance(array, RowReader) else np.asarray(array, dtype=np.int64)


def _blocks(array, f, join, empty=0):
    """``join`` of ``f`` of each block of rows of ``array`` (in memory or read from a file)."""
    step = max(1, BLOCK_BYTES // max(1, array[:1].nbytes))
    return join(empty, *(f(np.asarray(array[lo : lo + step])) for lo in range(0, len(array), step)))


def _check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def is_text_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a ``text.h5`` (:func:`write_text_dataset`); False for images or not HDF5."""
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("format") == "epochlens-text-1"
    except OSError:
        return False


#: Bytes of a chunk of token rows in ``text.h5`` (whole rows: a batch decompresses one or two).
TOKEN_CHUNK_BYTES = 1 << 20


def _tokens(group: h5py.Group, key: str, array) -> None:
    """``array`` (N, L), in memory or in a scratch file, into ``group[key]`` a block at a time."""
    rows = max(1, TOKEN_CHUNK_BYTES // (array.dtype.itemsize * max(1, int(np.prod(array.shape[1:])))))
    chunks = (min(rows, len(array)), *array.shape[1:]) if np.prod(array.shape) else None
    copy_rows(array, group.create_dataset(key, array.shape, array.dtype, chunks=chunks,
                                          compression="gzip" if chunks else None))  # fmt: skip


def _strings(group: h5py.Group, key: str, texts, step: int = 1 << 16) -> None:
    """``texts`` (a list, or strings read by rows: ``texts[lo:hi]``) into ``group[key]``."""
    out = group.create_dataset(key, (len(texts),), dtype=h5py.string_dtype())
    for lo in range(0, len(texts), step):
        out[lo : lo + step] = np.array(texts[lo : lo + step], dtype=object)


def write_text_dataset(dataset: TextDataset, path: str | Path) -> None:
    """Write ``dataset`` to ``path`` (``text.h5``), atomically."""
    with atomic_h5(path) as f:
        for split in ("train", "test"):
            g = f.create_group(split)
            for key in ("input_ids", "attention_mask", "labels"):
                _tokens(g, key, getattr(dataset, f"{split}_{key}"))
            if dataset.train_groups is not None:
                g.create_dataset("groups", data=dataset.groups(split))
            if dataset.texts(split) is not None:
                _strings(g, "text", dataset.texts(split))
        f["train"].create_dataset("holdout", data=dataset.holdout)
        if dataset.trigger_input_ids is not None:
            g = f.create_group("test_trigger")
            _tokens(g, "input_ids", dataset.trigger_input_ids)
            _tokens(g, "attention_mask", dataset.trigger_attention_mask)
            if dataset.trigger_text is not None:
                _strings(g, "text", dataset.trigger_text)
        if dataset.ground_truth is not None:  # your own poisoned samples (not hashed)
            f["train"].create_dataset("ground_truth", data=np.asarray(dataset.ground_truth, bool))
        f.attrs.update(
            format="epochlens-text-1",
            name=dataset.name,
            source=dataset.source,
            kind=dataset.kind,
            num_classes=dataset.num_classes,
            class_names=json.dumps(dataset.class_names),
            group_names=json.dumps(dataset.group_names),
            tokenizer=dataset.tokenizer,
            pad_token_id=dataset.pad_token_id,
            vocab_size=dataset.vocab_size,
            content_hash=dataset.content_hash,
            max_token_id=dataset.max_token_id(),
        )
