"""Influence per method from a checkpoint's ``scores.npz`` (:mod:`epochlens.influence.study_scores`):
each training sample's self-influence and its rank, its reduced influence on the queries (the
suspicion signal of ``tables/poison_detection.csv``), its top-k proponents and opponents among the
queries; each query's top-k training samples either way.

``pairwise_none`` (Q, N) holds g_qᵀ P g_n: positive where training sample n lowers query q's loss
(a proponent), negative where it raises it (an opponent). Holdout samples (not trained on) are NaN
and never a neighbour. ``query_influence`` is :func:`epochlens.study.poison.reduce_query_influence`
of the run's ``queries.reduce``, signed by the queries' ``query_sign``: higher = more suspect.
A store's scores too large to keep whole hold these reductions and neighbours instead of
``pairwise_*`` (``epochlens.influence.store_summary``: exact, the same ranks): read as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from epochlens.errors import InfluenceError
from epochlens.ranking import first_k
from epochlens.study.poison import query_signals, query_transforms

#: Neighbours kept per sample and direction.
NEIGHBOURS = 10


def read_scores(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of one ``scores.npz``; an unreadable file names itself and the fix."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as exc:
        raise InfluenceError(
            f"{path}: not a readable influence scores file ({exc}). Delete it and rerun its job."
        ) from exc


def top_k(scores: np.ndarray, k: int, largest: bool = True) -> tuple[pa.ListArray, pa.ListArray]:
    """Per row of ``scores`` (R, C): the columns of the k largest (or smallest) finite scores, in
    order (ties: lower column first), and those scores, as list arrays of R lists (shorter where a
    row has fewer finite scores)."""
    scores = np.asarray(scores, np.float64)
    order = first_k(np.where(np.isfinite(scores), -scores if largest else scores, np.inf), k)
    picked = np.take_along_axis(scores, order, axis=1)
    return _lists(order, picked, np.isfinite(picked))


def _lists(index: np.ndarray, scores: np.ndarray, keep: np.ndarray) -> tuple[pa.ListArray, pa.ListArray]:
    """Each row's ``index`` and ``scores`` where ``keep``, as two list arrays of a list a row."""
    offsets = pa.array(np.concatenate([[0], np.cumsum(keep.sum(1))]).astype(np.int32))
    return (
        pa.ListArray.from_arrays(offsets, pa.array(index[keep].astype(np.int64))),
        pa.ListArray.from_arrays(offsets, pa.array(scores[keep].astype(np.float64))),
    )


def rank_descending(values: np.ndarray) -> pd.array:
    """1 for the highest finite value, 2 for the next, ...; missing (NA) where not finite."""
    values = np.asarray(values, np.float64)
    ranks = pd.Series(values).rank(ascending=False, method="first")
    return pd.array(ranks.to_numpy(), dtype="Int64")


def _summarised(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether ``arrays`` hold a store's summary (reductions and neighbours) instead of pairwise scores."""
    return "query_influence_max_none" in arrays


def _no_queries(arrays: Mapping[str, np.ndarray]) -> bool:
    pairwise = arrays.get("pairwise_none")
    return not _summarised(arrays) and (pairwise is None or pairwise.shape[0] == 0)


def _neighbours(arrays: Mapping[str, np.ndarray], name: str, k: int) -> tuple[pa.ListArray, pa.ListArray]:
    """``proponents`` / ``opponents`` of each training sample among the queries, or ``top_train`` /
    ``bottom_train`` of each query: kept in a summary (-1 past the finite), else ranked here."""
    per_sample = name in ("proponents", "opponents")
    if not _summarised(arrays):
        pairwise = arrays["pairwise_none"]
        return top_k(pairwise.T if per_sample else pairwise, k, name in ("proponents", "top_train"))
    index = arrays[name][:, :k]
    return _lists(index, arrays[f"{name[:-1]}_scores" if per_sample else f"{name}_scores"][:, :k], index >= 0)


def train_columns(method: str, arrays: dict[str, np.ndarray], reduce: str, k: int = NEIGHBOURS) -> dict:
    """The training rows' columns of one method (each of length N), named ``*_{method}``."""
    self_scores = np.asarray(arrays["self_influence"], np.float64)
    cols = {
        f"self_influence_{method}": self_scores,
        f"self_influence_rank_{method}": rank_descending(self_scores),
    }
    if _no_queries(arrays):  # no query influence, no neighbours
        return cols
    cols[f"query_influence_{method}"] = query_signals(arrays, reduce, ["none"])["none"]
    for name in ("proponents", "opponents"):
        cols[f"{name}_{method}"], cols[f"{name[:-1]}_scores_{method}"] = _neighbours(arrays, name, k)
    return cols


def transform_signals(method: str, arrays: dict[str, np.ndarray], reduce: str) -> dict[str, np.ndarray]:
    """The query influence of one method under each query transform but ``none`` (the detection
    table's ``query_influence_{transform}`` signals), keyed ``{method}_query_influence_{transform}``:
    detectors of the dossier, not columns of their own."""
    others = [] if _no_queries(arrays) else [t for t in query_transforms(arrays, reduce) if t != "none"]
    return {f"{method}_query_influence_{t}": v for t, v in query_signals(arrays, reduce, others).items()}


def query_columns(method: str, arrays: dict[str, np.ndarray], k: int = NEIGHBOURS) -> dict:
    """The query rows' columns of one method (each of length Q): top and bottom training samples."""
    cols = {}
    for name in () if _no_queries(arrays) else ("top_train", "bottom_train"):
        cols[f"{name}_{method}"], cols[f"{name}_scores_{method}"] = _neighbours(arrays, name, k)
    return cols


def check_scores(path: str | Path, arrays: dict[str, np.ndarray], n_train: int) -> None:
    """Scores of another data set than the run's are refused, naming the file."""
    if len(arrays.get("self_influence", ())) != n_train:
        raise InfluenceError(
            f"{path}: self_influence of {len(arrays.get('self_influence', ()))} samples for a data set of "
            f"{n_train} training samples: the scores are of other data. Rerun its influence_scores job."
        )
