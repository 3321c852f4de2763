"""The labels and groups of a ``dataset.h5`` without its images (or a text run's tokens): what
table jobs need (a CIFAR-100 data set's images are ~180 MB, more than a whole table job may use).
Same file layout as :func:`epochlens.data.dataset.write_dataset` and
:func:`epochlens.data.text.write_text_dataset` (a separate module, so that table jobs reading it do
not rerun when the image code changes, and jobs that read images do not rerun when this does)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from epochlens.errors import DataError


@dataclass
class SplitLabels:
    """Labels (N,) int64 of one split (a regression's float targets (N,) or (N, D) as stored), its
    data groups (N,) int64 indices into ``group_names``, or None for data without groups, and the
    training split's holdout mask."""

    labels: np.ndarray
    groups: np.ndarray | None
    group_names: list[str]
    holdout: np.ndarray | None

    def group_of_each(self) -> np.ndarray | None:
        """(N,) object array of each sample's group name; None for data without groups."""
        if self.groups is None:
            return None
        return np.asarray(self.group_names, dtype=object)[self.groups]


def read_labels(path: str | Path, split: str = "train") -> SplitLabels:
    """Labels, groups and (train) holdout of ``split`` of a ``dataset.h5``, images left on disk."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    try:
        with h5py.File(path, "r") as f:
            g = f[split]
            return SplitLabels(
                labels=_labels(g["labels"][()]),
                groups=np.asarray(g["groups"][()], dtype=np.int64) if "groups" in g else None,
                group_names=json.loads(f.attrs.get("group_names", "[]")),
                holdout=np.asarray(g["holdout"][()], dtype=bool) if "holdout" in g else None,
            )
    except (OSError, KeyError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc


def _labels(stored: np.ndarray) -> np.ndarray:
    """Class ids as int64; regression targets (floats) as stored."""
    stored = np.asarray(stored)
    return stored if np.issubdtype(stored.dtype, np.floating) else stored.astype(np.int64)


def read_data_kind(path: str | Path) -> str:
    """``classification`` or ``regression``: what the labels of a ``dataset.h5`` are (a text
    data set's: classification)."""
    try:
        with h5py.File(path, "r") as f:
            return str(f.attrs.get("kind", "classification"))
    except OSError as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc


def read_num_classes(path: str | Path) -> int:
    """The number of classes of a ``dataset.h5`` (images or text), read from its attributes; a
    causal LM's or text-to-text model's data has one, its target tokens (:mod:`epochlens.outcome`)."""
    from epochlens.data.text import TOKEN_KINDS

    try:
        with h5py.File(path, "r") as f:
            return 1 if f.attrs.get("kind") in TOKEN_KINDS else int(f.attrs["num_classes"])
    except (OSError, KeyError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc
