"""Who each row of the dossier is: position, id, split, label or target, label name, group, text,
and the ground truth (corrupted or not), read from the run's ``dataset.h5`` without its images
(a table job stays light) and its ``corrupted_indices.npy``.

A training row's ``split`` is ``train`` or ``holdout`` (held out of training, kept for evaluation),
a query's ``test``; ``id`` is ``{train|test}:{position in that split}`` (a query's, that of the test
sample it is). A column the data has nothing for is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from epochlens.data.labels import SplitLabels, read_labels
from epochlens.data.text_rows import stored_strings
from epochlens.samples.sheets import SheetLayout


def class_names(path: str | Path) -> list[str] | None:
    """The data set's class names (None for a regression or a sequence model's data)."""
    with h5py.File(path, "r") as f:
        names = f.attrs.get("class_names")
        kind = str(f.attrs.get("kind", "classification"))
    return json.loads(names) if names is not None and kind == "classification" else None


def label_columns(labels: np.ndarray, names: list[str] | None) -> dict[str, object]:
    """``label`` (int64) and ``label_name`` of a classifier's labels; ``target`` (float64, or a
    list per sample of a multi-value target) of a regression's; nothing of token labels (N, L)."""
    labels = np.asarray(labels)
    if np.issubdtype(labels.dtype, np.floating):
        flat = labels.astype(np.float64)
        return {"target": flat if flat.ndim == 1 else list(flat.reshape(len(flat), -1))}
    if labels.ndim != 1:  # a causal LM's or text-to-text model's tokens: no label
        return {}
    out: dict[str, object] = {"label": labels.astype(np.int64)}
    if names is not None:
        out["label_name"] = np.asarray(names, dtype=object)[labels]
    return out


def identity_frame(
    dataset: str | Path,
    split: str,
    positions: np.ndarray,
    corrupted: np.ndarray | None,
    thumbnails: str | None = None,
    stored: SplitLabels | None = None,
) -> pd.DataFrame:
    """Identity columns of the samples at ``positions`` of ``split`` (``train`` or ``test``).

    ``corrupted``: the corrupted training positions (None: no ground truth known, no column).
    ``thumbnails``: the thumbnails' split name (train, test, test_trigger) of an image run, whose
    ``image`` column names them in their sheets (:mod:`epochlens.samples.sheets`); None: no column.
    ``stored``: the split's labels when the caller has read them (:func:`read_labels`).
    """
    stored = stored or read_labels(dataset, split)  # given: read once for every chunk of rows
    positions = np.asarray(positions, np.int64)
    frame = pd.DataFrame({"position": positions, "id": [f"{split}:{p}" for p in positions]})
    held = stored.holdout[positions] if split == "train" and stored.holdout is not None else False
    frame["split"] = np.where(held, "holdout", "train") if split == "train" else "test"
    for key, values in label_columns(stored.labels[positions], class_names(dataset)).items():
        frame[key] = values
    if (groups := stored.group_of_each()) is not None:
        frame["group"] = groups[positions]
    if (texts := stored_strings(dataset, f"{split}/text", positions)) is not None:  # these rows only
        frame["text"] = np.asarray(texts, dtype=object)
    if thumbnails is not None:
        frame["image"] = SheetLayout.of(dataset).names(thumbnails, positions)
    if corrupted is not None:
        frame["is_corrupted"] = np.isin(positions, corrupted) if split == "train" else False
    return frame
