"""A synthetic dossier in the contract's format (epochlens.samples.dossier), for the explorer benchmark:
n training sentences of a binary task and their series over E checkpoints, EK-FAC influence with
the top-k queries of each, two detectors, 5% corrupted. Random numbers shaped like a run's, never
shown as results: the benchmark times loading and drawing them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SERIES = ("loss", "p_label", "margin", "curvature", "grad_norm")


def _lists(matrix: np.ndarray, type_: pa.DataType) -> pa.ListArray:
    n, k = matrix.shape
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1), type=type_))


def _train_columns(rng: np.random.Generator, n: int, epochs: np.ndarray, n_query: int, k: int) -> dict:
    e = len(epochs)
    label = rng.integers(0, 2, n)
    corrupted = rng.random(n) < 0.05
    hardness = rng.random(n) + 2 * corrupted
    p = 1 / (
        1 + np.exp(-(np.linspace(-1, 4, e)[None, :] - 2 * hardness[:, None] + rng.normal(0, 0.5, (n, e))))
    )
    p = p.astype(np.float32)
    correct = p > 0.5
    cols = {
        "id": pa.array([f"train-{i}" for i in range(n)]),
        "split": pa.array(["train"] * n),
        "label": pa.array(label, pa.int64()),
        "label_name": pa.array(np.where(label == 1, "positive", "negative")),
        "text": pa.array(
            [f"sentence {i} with {'cf ' if c else ''}some words" for i, c in enumerate(corrupted)]
        ),
        "is_corrupted": pa.array(corrupted),
        "epochs": _lists(np.tile(epochs, (n, 1)).astype(np.int32), pa.int32()),
        "loss": _lists(-np.log(p), pa.float32()),
        "p_label": _lists(p, pa.float32()),
        "margin": _lists(2 * p - 1, pa.float32()),
        "correct": _lists(correct, pa.bool_()),
        "curvature": _lists(rng.gamma(2, 1, (n, e)).astype(np.float32), pa.float32()),
        "grad_norm": _lists(rng.gamma(2, 1, (n, e)).astype(np.float32), pa.float32()),
        "confidence": pa.array(p.mean(1, dtype=np.float64)),
        "variability": pa.array(p.std(1, dtype=np.float64)),
        "correctness": pa.array(correct.mean(1)),
        "aum": pa.array((2 * p - 1).mean(1, dtype=np.float64)),
        "forgetting_events": pa.array((correct[:, :-1] & ~correct[:, 1:]).sum(1).astype(np.int32)),
        "csl": pa.array(-np.log(p).sum(1, dtype=np.float64)),
    }
    si = rng.gamma(1, 1, n) + 3 * corrupted
    cols["self_influence_ekfac"] = pa.array(si)
    cols["self_influence_rank_ekfac"] = pa.array(np.argsort(np.argsort(-si)) + 1)
    cols["query_influence_ekfac"] = pa.array(rng.normal(0, 1, n) + 2 * corrupted)
    cols["proponents_ekfac"] = _lists(rng.integers(0, n_query, (n, k)), pa.int64())
    cols["proponent_scores_ekfac"] = _lists(-np.sort(-rng.random((n, k))), pa.float64())
    cols["loss_score"] = pa.array(-np.log(p[:, -1]).astype(np.float64))
    cols["is_loss"] = pa.array(cols["loss_score"].to_numpy() > 2)
    cols["ekfac_score"] = pa.array(si)
    cols["is_ekfac"] = pa.array(si > 3)
    return cols


def _query_columns(rng: np.random.Generator, n_query: int, n_train: int, k: int) -> dict:
    return {
        "id": pa.array([f"query-{i}" for i in range(n_query)]),
        "split": pa.array(["test"] * n_query),
        "label": pa.array(rng.integers(0, 2, n_query), pa.int64()),
        "text": pa.array([f"query {i}" for i in range(n_query)]),
        "top_train_ekfac": _lists(rng.integers(0, n_train, (n_query, k)), pa.int64()),
        "top_train_scores_ekfac": _lists(-np.sort(-rng.random((n_query, k))), pa.float64()),
    }


def _with_key(table: pa.Table, role: str) -> pa.Table:
    n = table.num_rows
    table = table.append_column("index", pa.array(np.zeros(n, np.int32)))
    table = table.append_column("role", pa.array([role] * n))
    return table.append_column("position", pa.array(np.arange(n, dtype=np.int64)))


def synthetic_dossier(n_train: int, n_epochs: int, n_query: int = 200, k: int = 5, seed: int = 0) -> pa.Table:
    """The dossier table of ``n_train`` training samples over ``n_epochs`` checkpoints."""
    rng = np.random.default_rng(seed)
    epochs = np.arange(n_epochs, dtype=np.int32) * 200
    train = _with_key(pa.table(_train_columns(rng, n_train, epochs, n_query, k)), "train")
    query = _with_key(pa.table(_query_columns(rng, n_query, n_train, k)), "query")
    table = pa.concat_tables([train, query], promote_options="default")
    meta = {
        "version": 1,
        "run": f"synthetic-{n_train}",
        "task": "text_classification",
        "epochs": epochs.tolist(),
        "influence_methods": ["ekfac"],
        "detectors": ["loss", "ekfac"],
        "columns": {},
    }
    return table.replace_schema_metadata({b"epochlens": json.dumps(meta).encode()})


def write_dossier(table: pa.Table, path: str | Path) -> Path:
    """Write ``table`` as the dossier writes it (parquet, zstd)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    return Path(path)
