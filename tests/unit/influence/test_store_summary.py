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
            write(
                part[usable[part]] - part[0],
                rows[part][usable[part]],
                np.ones(usable[part].sum(), np.float32),
            )
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
    four = first_k(key, 4)  # the second row's 4th is one of its infinite keys (left out as not finite)
    np.testing.assert_array_equal(four[0], [3, 1, 2, 4])
    np.testing.assert_array_equal(four[1, :3], [5, 2, 4])
    assert np.isinf(key[1, four[1, 3]])
    assert first_k(key, 0).shape == (2, 0) and first_k(key, 9).shape == (2, 6)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_the_dossier_reads_a_summary_as_the_full_scores(store_and_queries, reduce):
    """samples/neighbours.py's columns of a summary's scores.npz arrays (study_store_scores.summary_arrays,
    the store's rows placed at training positions with a holdout between them) equal those of the
    full scores: query influence, neighbours both ways, the other transforms' signals."""
    from epochlens.influence.study_store_scores import summary_arrays
    from epochlens.samples.neighbours import query_columns, train_columns, transform_signals

    store, curvature, queries = store_and_queries
    n, positions = 2 * len(store), 2 * np.arange(len(store)) + 1  # every other sample held out
    sign = -1.0
    summary = store_summary(store, curvature, queries, sign, k=5)
    full = {"self_influence": np.full(n, np.nan), "query_sign": np.float64(sign)}
    full["self_influence"][positions] = summary.self_influence
    for t, q in queries.items():
        full[f"pairwise_{t}"] = np.full((len(q), n), np.nan, np.float32)
        full[f"pairwise_{t}"][:, positions] = store_scores(store, curvature, q)[0]
    kept = {**full, **summary_arrays(summary, positions, n)}
    kept = {k: v for k, v in kept.items() if not k.startswith("pairwise_")}
    for got, want in (
        (train_columns("m", kept, reduce, k=4), train_columns("m", full, reduce, k=4)),
        (query_columns("m", kept, k=4), query_columns("m", full, k=4)),
        (transform_signals("m", kept, reduce), transform_signals("m", full, reduce)),
    ):
        assert got.keys() == want.keys()
        for name, value in want.items():
            if hasattr(value, "to_pylist"):
                np.testing.assert_allclose(
                    np.concatenate([*map(np.asarray, got[name].to_pylist()), [0]]),
                    np.concatenate([*map(np.asarray, value.to_pylist()), [0]]),
                    rtol=1e-12,
                    err_msg=name,
                )
                assert [len(v) for v in got[name].to_pylist()] == [len(v) for v in value.to_pylist()], name
            else:
                np.testing.assert_allclose(np.asarray(got[name], float), np.asarray(value, float), rtol=1e-9)
