"""The tiny dossier the explorer's tests build from (the contract: epochlens.samples.dossier)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

EPOCHS = [0, 5, 10]


def write_tiny_dossier(path, rows=None, meta=True, split=True):
    """Two training sentences and two queries of index 0, one training sentence of index 1 (held out)."""
    cols = rows or {
        "index": pa.array([0, 0, 0, 0, 1], pa.int32()),
        "role": ["train", "train", "query", "query", "train"],
        "position": pa.array([0, 1, 0, 1, 0], pa.int64()),
        "id": ["a", "b", "q0", "q1", "a"],
        "split": ["train", "train", "test", "test", "holdout"],
        "label": pa.array([1, 0, 1, 0, 1], pa.int64()),
        "text": ["good film", "cf bad film", "query one", "query two", "good film"],
        "is_corrupted": pa.array([False, True, None, None, False]),
        "epochs": pa.array([EPOCHS, EPOCHS, None, None, EPOCHS], pa.list_(pa.int32())),
        "loss": pa.array(
            [[1.0, 0.5, 0.25], [2.0, float("nan"), 3.0], None, None, [1.5, 1.0, 0.5]], pa.list_(pa.float32())
        ),
        "correct": pa.array([[False, True, True], [True, False, True], None, None, [True, True, False]]),
        "confidence": pa.array([0.6, 0.2, None, None, 0.5]),
        "loss_score": pa.array([0.1, 0.9, None, None, 0.95]),
        "proponents_ekfac": pa.array([[1, 0], [0], None, None, [0]], pa.list_(pa.int64())),
        "proponent_scores_ekfac": pa.array([[0.5, 0.25], [0.75], None, None, [0.1]], pa.list_(pa.float64())),
        "top_train_ekfac": pa.array([None, None, [1, 0], [0], None], pa.list_(pa.int64())),
        "top_train_scores_ekfac": pa.array([None, None, [2.0, 1.0], [3.0], None], pa.list_(pa.float64())),
    }
    if not split:
        del cols["split"]
    table = pa.table(cols)
    if meta:
        m = {"version": 1, "run": "tiny", "task": "text_classification", "epochs": EPOCHS, "columns": {}}
        table = table.replace_schema_metadata({b"epochlens": json.dumps(m).encode()})
    pq.write_table(table, path)
    return path
