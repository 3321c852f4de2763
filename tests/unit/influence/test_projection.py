"""The projected methods (LoGra-style projection, the gradient store, the projected curvature) against
exact answers: with projections that are the identity, the projected Gauss-Newton influence equals the
explicit block-diagonal GGN's and the projected EK-FAC equals EK-FAC; with random projections the error
of gradient inner products falls as the dimension grows (Johnson-Lindenstrauss); the store's shards,
dtypes and files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_influence import (
    MLP,
    TinyCNN,
    assert_matches,
    dampings_of,
    data,
    exact_scores,
    explicit_quantities,
    projected_rows,
    projection_errors,
)

from epochlens.errors import ConfigError, InfluenceError
from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    self_influence,
)
from epochlens.influence.covariances import resolve_layers
from epochlens.influence.gradient_store import GradientStore, ShardInfo, StoreWriter, store_scores, store_topk
from epochlens.influence.layer_projection import layer_projections
from epochlens.influence.projected_basis import ProjectedBasis, projected_basis, store_curvature
from epochlens.influence.projected_curvature import projected_curvature
from epochlens.influence.projection import project_samples, projection_pass
from epochlens.influence.projection_settings import ProjectionSettings, projection_settings


def _layers(model, settings, projection) -> list:
    return projection_pass(projection).layout(resolve_layers(model, settings), projection)


@pytest.mark.parametrize(
    ("model", "shape", "classes"),
    [(lambda: MLP(5, 4, 3), (5,), 3), (lambda: TinyCNN(3), (2, 6, 6), 3)],
    ids=["mlp", "cnn"],
)
def test_identity_projection_is_exact_block_gauss_newton(model, shape, classes):
    torch.manual_seed(0)
    net = model().double().eval()
    x, y = data(16, shape, classes, 1)
    active = np.arange(classes)
    settings = InfluenceSettings(method="identity", fisher="expected", damping=0.1)
    out, result, layers = projected_rows(net, x, y, active, settings, ProjectionSettings(dim=1000))
    assert all(r[1:3] == r[3:5] for r in layers)  # nothing projected
    curvature = projected_curvature(
        projected_basis(result.fisher, result.n_fisher, layers, "gauss_newton"), settings
    )
    pair = curvature.apply(out) @ out.T
    exact_pair, exact_self = exact_scores(
        explicit_quantities(net, x, y, active), dampings_of(curvature.diagnostics)
    )
    assert_matches(pair, exact_pair, rtol=1e-9)
    assert_matches(np.diag(pair), exact_self, rtol=1e-9)


@pytest.mark.parametrize("fisher", ["true", "expected"])
def test_identity_projection_with_ekfac_equals_ekfac(fisher):
    """The projected EK-FAC (eigenbasis of the projected Kronecker factors, eigenvalues refitted from
    the projected Gauss-Newton block) is EK-FAC where nothing is projected: the same draws of the true
    Fisher, the same pairwise and self-influence."""
    torch.manual_seed(0)
    net = MLP(6, 5, 4).double().eval()
    x, y = data(24, (6,), 4, 2)
    active = np.arange(4)
    settings = InfluenceSettings(method="identity", fisher=fisher, damping=0.1)
    out, result, layers = projected_rows(net, x, y, active, settings, ProjectionSettings(dim=64))
    curvature = projected_curvature(
        projected_basis(result.fisher, result.n_fisher, layers, "ekfac"), settings
    )
    ekfac = InfluenceSettings(method="ekfac", fisher=fisher, damping=0.1)
    factors = fit_factors(net, x, y, active, ekfac)
    reference = pairwise_influence(net, factors, x, y, x[:5], y[:5], active, ekfac)
    assert_matches(curvature.apply(out[:5]) @ out.T, reference.scores, rtol=1e-9)
    own = self_influence(net, factors, x, y, active, ekfac).scores
    assert_matches(np.einsum("nd,nd->n", curvature.apply(out), out), own, rtol=1e-9)
    np.testing.assert_allclose(curvature.diagnostics["damping"], reference.diagnostics["damping"], rtol=1e-9)


def test_random_projection_error_falls_with_dimension():
    """Johnson-Lindenstrauss: projected gradient inner products approach the exact ones, their
    relative error (mean over 8 seeds of the projections) falling as a power of the dimension."""
    dims = (2, 4, 8, 16, 32)
    errors, slope = projection_errors(
        lambda d, seed: ProjectionSettings(dim=d, precondition="none", seed=seed), dims
    )
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False)), errors
    assert -1.2 < slope < -0.4, (slope, errors)  # 1/√k per side, at most 1/k: the order JL predicts
    assert errors[-1] < 0.4


def test_projections_are_drawn_from_seed_and_layer():
    """The same projections in every job (a pure function of seed, layer and side); a side no
    larger than dim is kept whole (the identity)."""
    layers = resolve_layers(MLP(48, 40, 10), InfluenceSettings())
    a = layer_projections(layers, ProjectionSettings(dim=12, seed=3))
    b = layer_projections(layers, ProjectionSettings(dim=12, seed=3))
    c = layer_projections(layers, ProjectionSettings(dim=12, seed=4))
    assert torch.equal(a["fc1"].inp, b["fc1"].inp) and not torch.equal(a["fc1"].inp, c["fc1"].inp)
    assert not torch.equal(a["fc1"].inp[:, :41], a["fc2"].inp)
    assert a["fc2"].out is None and a["fc2"].k_out == 10 and a["fc2"].inp.shape == (12, 41)
    assert a["fc1"].offset == 0 and a["fc2"].offset == 144 and a["fc2"].size == 120


def _store(tmp_path, net, x, y, active, settings, projection, shards):
    """A store of ``shards`` shards written as the workflow's jobs write them."""
    layers = _layers(net, settings, projection)
    width = sum(r[3] * r[4] for r in layers)
    bounds = np.linspace(0, len(x), shards + 1).astype(int)
    paths = []
    for k in range(shards):
        rows = np.arange(bounds[k], bounds[k + 1])
        npy, pt = tmp_path / f"s{k}-{projection.dtype}.npy", tmp_path / f"s{k}-{projection.dtype}.pt"
        with StoreWriter(npy, len(rows), width, projection.dtype) as writer:
            r = project_samples(
                net, x[rows], y[rows], settings=settings, projection=projection, active_classes=active,
                sample_indices=rows, write=writer,
            )  # fmt: skip
        ShardInfo(
            rows,
            r.scales,
            r.losses,
            r.usable,
            layers,
            r.fisher,
            r.n_fisher,
            r.skipped,
            r.vanished,
            {"k": 1},
            {},
        ).save(pt)
        paths.append((npy, pt))
    return GradientStore(paths)


def test_store_shards_and_float16(tmp_path):
    """Two shards give the one shard's scores (their sums add up; the Fisher's draws are per
    sample); a float16 store (rows scaled) agrees to ~3 digits."""
    torch.manual_seed(0)
    net = MLP(12, 10, 4).double().eval()
    x, y = data(40, (12,), 4, 3)
    active = np.arange(4)
    settings = InfluenceSettings(method="identity", damping=0.1)
    projection = ProjectionSettings(dim=6)
    queries, _, layers = projected_rows(net, x[:7], y[:7], active, settings, projection, curvature=False)
    scores, curvatures = {}, {}
    for shards, dtype in ((1, "float32"), (2, "float32"), (1, "float16")):
        p = ProjectionSettings(dim=6, dtype=dtype)
        store = _store(tmp_path / f"{shards}{dtype}", net, x, y, active, settings, p, shards)
        sums, n = store.fisher()
        curvature = projected_curvature(projected_basis(sums, n, layers), settings)
        scores[shards, dtype] = store_scores(store, curvature, curvature.apply(queries), chunk_bytes=1000)
        curvatures[shards, dtype] = curvature
    np.testing.assert_allclose(scores[2, "float32"][0], scores[1, "float32"][0], rtol=1e-9)
    np.testing.assert_allclose(scores[2, "float32"][1], scores[1, "float32"][1], rtol=1e-9)
    half, full = scores[1, "float16"][0], scores[1, "float32"][0]
    assert np.abs(half - full).max() < 3e-3 * np.abs(full).max()

    # The curvature eigendecomposed once from the shards' .pt (curvature.pt), damped when scored.
    basis = store_curvature([tmp_path / "2float32" / f"s{k}-float32.pt" for k in range(2)], "gauss_newton")
    basis.save(tmp_path / "curvature.pt")
    again = projected_curvature(ProjectedBasis.load(tmp_path / "curvature.pt"), settings)
    np.testing.assert_allclose(again.apply(queries), curvatures[2, "float32"].apply(queries), rtol=1e-12)
    (tmp_path / "bad.pt").write_bytes(b"nothing")
    with pytest.raises(InfluenceError, match="bad.pt: not a readable projected curvature"):
        ProjectedBasis.load(tmp_path / "bad.pt")

    # Exact chunked top-k (chunks of 2 rows across two shards) = the full matrix's sorted rows.
    store = _store(tmp_path / "topk", net, x, y, active, settings, projection, 2)
    sums, n = store.fisher()
    curvature = projected_curvature(projected_basis(sums, n, layers), settings)
    pre = curvature.apply(queries)
    pairwise, _ = store_scores(store, curvature, pre)
    top = store_topk(store, pre, 5, chunk_bytes=2 * store.width * 8)
    np.testing.assert_array_equal(top.query_indices, np.argsort(-pairwise, 1, kind="stable")[:, :5])
    np.testing.assert_allclose(top.query_scores, -np.sort(-pairwise, 1)[:, :5], rtol=1e-12)
    np.testing.assert_array_equal(top.sample_indices, np.argsort(-pairwise.T, 1, kind="stable")[:, :5])
    few = store_topk(store, pre[:3], 5)  # fewer queries than k: each sample ranks all 3
    assert few.sample_indices.shape == (40, 3) and few.query_indices.shape == (3, 5)


def test_store_writer_fills_gaps_and_files_are_checked(tmp_path):
    path = tmp_path / "s.npy"
    with StoreWriter(path, 5, 3, "float32") as write:
        write(np.array([1, 3]), np.ones((2, 3)), np.ones(2, np.float32))
    rows = np.load(path)
    assert np.isnan(rows[[0, 2, 4]]).all() and (rows[[1, 3]] == 1).all()
    with pytest.raises(ValueError, match="increasing"), StoreWriter(tmp_path / "t.npy", 5, 3, "float32") as w:
        w(np.array([3, 1]), np.ones((2, 3)), np.ones(2, np.float32))
    assert not (tmp_path / "t.npy").exists()  # a failed shard leaves no file
    info = ShardInfo(
        np.arange(4), np.ones(4, np.float32), np.zeros(4), np.ones(4, bool), [], {}, 0, [], [], {}, {}
    )
    info.save(tmp_path / "s.pt")
    with pytest.raises(InfluenceError, match="5 rows but its .pt describes 4"):
        GradientStore([(path, tmp_path / "s.pt")])
    (tmp_path / "bad.pt").write_bytes(b"not a shard")
    with pytest.raises(InfluenceError, match="bad.pt: not a readable gradient-store shard"):
        GradientStore([(path, tmp_path / "bad.pt")])


def test_projection_settings_refuse_bad_values():
    assert projection_settings({"dim": 8}, seed=2) == ProjectionSettings(dim=8, seed=2)
    with pytest.raises(ConfigError, match="dim=0 must be an integer >= 1.*dtype='int8'"):
        ProjectionSettings(dim=0, dtype="int8")
