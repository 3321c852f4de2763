"""The store's summary (influence/store_summary.py) against the full (Q, N) matrix: the reductions over
the queries equal the study's (reduce_query_influence, query_signal) on the full scores, the neighbours
equal the dossier's top-k of them, ties and unusable rows included, in chunks across shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.influence import InfluenceSettings
from epochlens.influence.gradient_store import GradientStore, ShardInfo, StoreWriter, store_scores
from epochlens.influence.projected_basis import projected_basis
from epochlens.influence.projected_curvature import projected_curvature
from epochlens.influence.store_summary import REDUCTIONS, first_k, store_summary
from epochlens.samples.neighbours import top_k
from epochlens.study.poison import reduce_query_influence

WIDTH = 6


def _write_store(folder, rows: np.ndarray, shards: int) -> GradientStore:
    """Shards of ``rows`` (NaN rows unusable) as the store jobs write them: .npy rows and .pt info."""
    layers = [["fc", 2, 3, 2, 3, 0]]
    usable = np.isfinite(rows).all(1)
    g = torch.from_numpy(np.nan_to_num(rows[usable]))
    sums = {"gauss_newton": {"fc": g.T @ g}, "activation": {}, "gradient": {}}
    pairs = []
    for k, part in enumerate(np.array_split(np.arange(len(rows)), shards)):
        npy, pt = folder / f"s{k}.npy", folder / f"s{k}.pt"
        with StoreWriter(npy, len(part), WIDTH, "float32") as write:
            write(part[usable[part]] - part[0], rows[part][usable[part]], np.ones(usable[part].sum(), np.float32))
        info = ShardInfo(part, np.ones(len(part), np.float32), np.zeros(len(part)), usable[part], layers,
                         sums, int(usable.sum()), [], [], {"k": 1}, {})  # fmt: skip
        info.save(pt)
        pairs.append((npy, pt))
    return GradientStore(pairs)


@pytest.fixture
def store_and_queries(tmp_path):
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((37, WIDTH))
    rows[[4, 20]] = np.nan  # unusable samples
    rows[30] = rows[7]  # a duplicate: tied scores on every query
    rows[12] = 0.0  # a vanished gradient: ties at zero
    store = _write_store(tmp_path, rows, shards=3)
    sums, n = store.fisher()
    curvature = projected_curvature(
        projected_basis(sums, n, store.infos[0].layers), InfluenceSettings(method="identity", damping=0.1)
    )
    queries = {t: curvature.apply(rng.standard_normal((9, WIDTH))) for t in ("none", "hflip")}
    queries["hflip"][3] = np.nan  # a query scored on no sample: left out of the reductions
    return store, curvature, queries


@pytest.mark.parametrize("chunk_rows", [2, 5, 1000])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_summary_equals_the_full_matrix(store_and_queries, chunk_rows, sign):
    store, curvature, queries = store_and_queries
    full = {t: store_scores(store, curvature, q)[0].astype(np.float32) for t, q in queries.items()}
    _, self_ = store_scores(store, curvature, queries["none"])
    summary = store_summary(store, curvature, queries, sign, k=4, chunk_bytes=chunk_rows * WIDTH * 8)
    np.testing.assert_allclose(summary.self_influence, self_, rtol=1e-12)
    for t, pairwise in full.items():
        for reduce in REDUCTIONS:
            np.testing.assert_allclose(
                summary.reduced[f"{reduce}_{t}"], reduce_query_influence(pairwise, sign, reduce), rtol=1e-9
            )
    pairwise = full["none"]
    for name, scores, largest in (
        ("top_train", pairwise, True),
        ("bottom_train", pairwise, False),
        ("proponents", pairwise.T, True),
        ("opponents", pairwise.T, False),
    ):
        index, values = summary.neighbours[name]
        positions, expected = top_k(scores, 4, largest)
        assert [list(r[r >= 0]) for r in index] == positions.to_pylist(), name
        assert [list(v[np.isfinite(v)]) for v in values] == expected.to_pylist(), name
    assert np.isnan(summary.neighbours["proponents"][1][[4, 20]]).all()
    assert summary.neighbours["top_train"][0].shape == (9, 4)


def test_first_k_breaks_ties_to_the_lower_column():
    key = np.array([[3.0, 1.0, 1.0, 0.0, 1.0, np.inf], [np.inf, np.inf, 2.0, np.inf, 5.0, 1.0]])
    np.testing.assert_array_equal(first_k(key, 3), [[3, 1, 2], [5, 2, 4]])
    np.testing.assert_array_equal(first_k(key, 4), [[3, 1, 2, 4], [5, 2, 4, 0]])
    assert first_k(key, 0).shape == (2, 0) and first_k(key, 9).shape == (2, 6)
