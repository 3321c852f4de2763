"""Checks shared by the workflow tests of the dossier: the dossier of a finished run equals,
column by column, the arrays and tables it comes from (sample_outputs.npz, dataset.h5,
corrupted_indices.npy, the influence scores and the detection tables)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from epochlens.data.labels import read_labels
from epochlens.layout import Layout


def read(paths: Layout, run: str) -> tuple[pd.DataFrame, dict]:
    table = pq.read_table(paths.dossier(run))
    return table.to_pandas(), json.loads(table.schema.metadata[b"epochlens"])


def stacked(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A list column as (rows, checkpoints)."""
    return np.stack(frame[column].to_numpy())


def check_training_rows(paths: Layout, run: str, index: int) -> pd.DataFrame:
    """Identity and series of one index's training rows against dataset.h5, the ground truth and
    sample_outputs.npz; returns those rows."""
    dossier, meta = read(paths, run)
    rows = dossier[(dossier["index"] == index) & (dossier["role"] == "train")]
    stored = read_labels(paths.dataset(run), "train")
    n = len(stored.labels)
    np.testing.assert_array_equal(rows["position"], np.arange(n))  # rows line up by position
    np.testing.assert_array_equal(rows["id"], [f"train:{p}" for p in range(n)])
    holdout = stored.holdout if stored.holdout is not None else np.zeros(n, bool)
    np.testing.assert_array_equal(rows["split"] == "holdout", holdout)
    if "label" in rows:
        np.testing.assert_array_equal(rows["label"].astype(np.int64), stored.labels)
    corrupted = np.load(paths.corrupted_indices(run))
    if len(corrupted):
        np.testing.assert_array_equal(np.flatnonzero(rows["is_corrupted"].astype(bool)), np.sort(corrupted))
    else:
        assert "is_corrupted" not in dossier  # no ground truth: absent, not all False
    with np.load(paths.sample_outputs(run, index)) as npz:
        outputs = {k: npz[k] for k in npz.files}
    assert meta["epochs"] == outputs["epochs"].tolist()
    assert all(list(e) == meta["epochs"] for e in rows["epochs"])
    for key in ("loss", "p_label", "margin", "correct", "predicted", "abs_error"):
        if f"train_{key}" in outputs:
            want = outputs[f"train_{key}"].T
            want = want.astype(np.float32) if want.dtype == np.float64 else want
            np.testing.assert_array_equal(stacked(rows, key), want, err_msg=key)
        else:
            assert key not in dossier, key  # what the run did not compute is absent
    return rows


def check_summaries(rows: pd.DataFrame) -> None:
    """Cartography and AUM of the rows against their own series (NaN: inactive)."""
    p, margin = stacked(rows, "p_label").astype(np.float64), stacked(rows, "margin").astype(np.float64)
    seen = np.isfinite(p).any(1)
    # (the summaries are of the float64 outputs, the lists float32: agreement to float32 precision)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(rows["confidence"][seen], np.nanmean(p[seen], 1), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rows["variability"][seen], np.nanstd(p[seen], 1), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(rows["aum"][seen], np.nanmean(margin[seen], 1), rtol=1e-5, atol=1e-6)
    correct = stacked(rows, "correct") & np.isfinite(p)
    np.testing.assert_allclose(rows["correctness"][seen], correct[seen].sum(1) / np.isfinite(p[seen]).sum(1))


def check_influence(paths: Layout, run: str, index: int, epoch: int, methods, k: int = 10) -> None:
    """Self-influence, its rank, query influence (against the detection study's top-ranked
    table) and neighbours of every method against its scores.npz."""
    dossier, meta = read(paths, run)
    rows = dossier[(dossier["index"] == index) & (dossier["role"] == "train")]
    queries = dossier[(dossier["index"] == index) & (dossier["role"] == "query")]
    top = pd.read_csv(paths.table("influence_top_ranked", run))
    assert meta["influence_epochs"] == {str(index): epoch}
    for method in methods:
        with np.load(paths.influence_file("scores.npz", run, index, epoch, method)) as npz:
            self_scores, pairwise = npz["self_influence"], npz["pairwise_none"]
            tests = npz["query_test_indices"]
        np.testing.assert_array_equal(rows[f"self_influence_{method}"], self_scores)
        ranks = rows[f"self_influence_rank_{method}"].to_numpy(dtype=float, na_value=np.nan)
        finite = np.isfinite(self_scores)
        assert np.isnan(ranks[~finite]).all()
        assert ranks[np.argmax(np.where(finite, self_scores, -np.inf))] == 1
        for signal in sorted(set(top.loc[top["method"] == method, "signal"])):  # and each transform's
            mine = top[(top["method"] == method) & (top["signal"] == signal) & (top["index"] == index)]
            column = rows[f"{method}_{signal}_score"].to_numpy(dtype=float)
            order = np.argsort(-np.where(np.isfinite(column), column, -np.inf), kind="stable")
            np.testing.assert_array_equal(order[: len(mine)], mine.sort_values("rank")["sample"])
            np.testing.assert_allclose(column[mine["sample"]], mine["score"], rtol=1e-12)
        np.testing.assert_array_equal(queries["id"], [f"test:{t}" for t in tests])
        for n in (0, int(np.flatnonzero(finite)[-1])):  # a holdout sample first where there is one
            want = np.argsort(-np.where(np.isfinite(pairwise[:, n]), pairwise[:, n], -np.inf), kind="stable")
            want = [q for q in want[:k] if np.isfinite(pairwise[q, n])]
            assert list(rows[f"proponents_{method}"].iloc[n]) == want
        for q in range(len(tests)):
            row = pairwise[q]
            want = np.argsort(np.where(np.isfinite(row), row, np.inf), kind="stable")[:k]
            assert list(queries[f"bottom_train_{method}"].iloc[q]) == list(want)
            np.testing.assert_array_equal(queries[f"bottom_train_scores_{method}"].iloc[q], row[want])


def check_detectors(rows: pd.DataFrame, meta: dict) -> None:
    """Every detector: a score and a flag above Tukey's fence of the trained rows' scores."""
    trained = (rows["split"] == "train").to_numpy()
    for name in meta["detectors"]:
        score = rows[f"{name}_score"].to_numpy(dtype=float)
        values = score[trained & np.isfinite(score)]
        if len(values) == 0:  # not computed for this index (influence.indices): null, not False
            assert rows[f"is_{name}"].isna().all() and rows[f"{name}_score"].isna().all(), name
            continue
        q1, q3 = np.percentile(values, [25, 75])
        flagged = np.nan_to_num(score, nan=-np.inf) > q3 + 1.5 * (q3 - q1)
        np.testing.assert_array_equal(rows[f"is_{name}"].astype(bool), flagged, err_msg=name)
