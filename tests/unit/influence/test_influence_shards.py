"""Sharded influence (what the workflow's shard jobs compute): sums over shards of the training set
add up to the unsharded pass, shard files round-trip, and each sample's scores do not depend on the
shard it is scored in."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from epochlens.errors import FactorCacheError
from epochlens.influence import InfluenceSettings, fit_factors, pairwise_influence, self_influence
from epochlens.influence.covariances import CovarianceSums, covariance_sums
from epochlens.influence.factors import (
    CorrectionSums,
    apply_corrections,
    correction_sums,
    eigendecompose,
    empty_factors,
)
from epochlens.influence.io import load_sums, save_sums
from epochlens.influence.study_inputs import shard_rows
from epochlens.models.networks import SmallCNN

ACTIVE = np.arange(6)


def _problem(n: int = 70, seed: int = 0):
    torch.manual_seed(seed)
    model = SmallCNN(num_classes=10).eval()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=gen)
    y = torch.randint(0, 8, (n,), generator=gen).numpy()  # labels 6, 7: inactive, not scorable
    return model, x, y


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _sharded_factors(model, x, y, settings, nshards):
    """The workflow's sharded fit: covariance shards summed and eigendecomposed, then correction
    shards (in that eigenbasis) summed."""
    idx = np.arange(len(x))
    parts = [
        (x[torch.as_tensor(r)], y[r], idx[r])
        for r in (shard_rows(len(x), k, nshards) for k in range(nshards))
    ]
    factors = empty_factors(model, settings)
    if settings.method in ("kfac", "ekfac"):
        sums = [covariance_sums(model, xs, ys, ACTIVE, settings, ids) for xs, ys, ids in parts]
        eigendecompose(factors, CovarianceSums.merged(sums), settings)
    if settings.method in ("ekfac", "diagonal"):
        basis = factors if settings.method == "ekfac" else None
        sums = [correction_sums(model, basis, xs, ys, ACTIVE, settings, ids) for xs, ys, ids in parts]
        apply_corrections(factors, CorrectionSums.merged(sums))
    return factors


def test_shard_rows_cover_every_position_once_in_order():
    for n, s in ((10, 3), (7, 7), (5, 8), (0, 2), (1000, 13)):
        rows = [shard_rows(n, k, s) for k in range(s)]
        np.testing.assert_array_equal(np.concatenate(rows), np.arange(n))
        sizes = [len(r) for r in rows]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="shard 3 of 3"):
        shard_rows(10, 3, 3)


@pytest.mark.parametrize(
    ("method", "fisher"),
    [("ekfac", "true"), ("ekfac", "empirical"), ("kfac", "empirical"), ("diagonal", "true")],
)
@pytest.mark.parametrize(
    ("n", "all_scorable", "rtol"),
    [
        # 3 shards of 24 = 3 batches of 8: the same float32 forward passes, only the order of the
        # float64 sums differs (relative differences ~1e-15 measured).
        (72, True, 1e-12),
        # Shards of 23-24 with inactive classes: batches of other samples, whose float32 forward
        # passes round differently (~1e-9 relative in the factors measured; float32 eps 1.2e-7).
        (70, False, 1e-6),
    ],
)
def test_sharded_factors_equal_the_unsharded_fit(method, fisher, n, all_scorable, rtol):
    """Sums over 3 shards equal the one pass up to rounding (tolerances above, with the reason).
    The true Fisher draws per global sample index, so shards draw the labels the whole pass draws."""
    model, x, y = _problem(n)
    if all_scorable:
        y = y % len(ACTIVE)
    settings = InfluenceSettings(method=method, fisher=fisher, factor_batch_size=8)
    ref = _quiet(fit_factors, model, x, y, ACTIVE, settings)
    got = _quiet(_sharded_factors, model, x, y, settings, 3)
    assert got.n_samples == ref.n_samples == int(np.isin(y, ACTIVE).sum())
    for name, lf in ref.layers.items():
        g = got.layers[name]
        for attr in ("activation_values", "gradient_values", "corrected", "diagonal"):
            a, b = getattr(lf, attr), getattr(g, attr)
            if a is None:
                assert b is None
                continue
            assert torch.allclose(b, a, rtol=rtol, atol=rtol * float(a.abs().max())), (name, attr)
    # Scores from either fit (eigenvectors move by the same rounding): asserted 1000x looser.
    s_ref = _quiet(self_influence, model, ref, x, y, ACTIVE, settings).scores
    s_got = _quiet(self_influence, model, got, x, y, ACTIVE, settings).scores
    np.testing.assert_allclose(s_got, s_ref, rtol=1000 * rtol)
    assert np.isnan(s_ref[~np.isin(y, ACTIVE)]).all()


def test_shard_files_round_trip_and_refuse_other_keys(tmp_path):
    model, x, y = _problem(30)
    settings = InfluenceSettings(method="ekfac", fisher="empirical")
    cov = covariance_sums(model, x, y, ACTIVE, settings)
    key = {"factors": {"data": "abc"}, "pass": "covariances", "shard": [0, 2]}
    save_sums(tmp_path / "c.pt", cov, key)
    back = load_sums(tmp_path / "c.pt", expected_key=key)
    assert isinstance(back, CovarianceSums)
    assert (back.n_valid, back.n_seen, back.positions) == (cov.n_valid, cov.n_seen, cov.positions)
    for n in cov.activation:
        assert torch.equal(back.activation[n], cov.activation[n])
        assert torch.equal(back.gradient[n], cov.gradient[n])
    factors = eigendecompose(empty_factors(model, settings), cov, settings)
    corr = correction_sums(model, factors, x, y, ACTIVE, settings)
    save_sums(tmp_path / "k.pt", corr, key)
    back = load_sums(tmp_path / "k.pt")
    assert isinstance(back, CorrectionSums)
    assert all(torch.equal(back.sums[n], corr.sums[n]) for n in corr.sums)
    with pytest.raises(FactorCacheError, match="shard: stored"):
        load_sums(tmp_path / "c.pt", expected_key={**key, "shard": [1, 2]})
    (tmp_path / "bad.pt").write_bytes(b"not a shard")
    with pytest.raises(FactorCacheError, match="bad.pt: not a readable epochlens shard file"):
        load_sums(tmp_path / "bad.pt")


@pytest.mark.parametrize("method", ["ekfac", "identity"])
def test_scores_do_not_depend_on_the_shard(method):
    """Each training sample's scores computed in a shard: bit-equal to the unsharded pass where the
    shard boundaries fall on batch boundaries (the same batches, the same arithmetic); elsewhere
    within 1e-6 relative: the float32 forward and backward passes of batches of other samples round
    differently (5e-8 measured; float32 eps 1.2e-7). Each shard is told the whole pass's size
    (train_total), so that it holds the queries the way the unsharded pass does."""
    model, x, y = _problem(64)
    y = y % len(ACTIVE)  # every sample scorable: the shards' batches are the unsharded pass's
    xq, yq = x[:5], y[:5]
    settings = InfluenceSettings(method=method, fisher="empirical", train_batch_size=8)
    factors = _quiet(fit_factors, model, x, y, ACTIVE, settings) if method != "identity" else None
    idx = np.arange(len(x))
    ref_self = _quiet(self_influence, model, factors, x, y, ACTIVE, settings).scores
    ref_pair = _quiet(pairwise_influence, model, factors, x, y, xq, yq, ACTIVE, settings).scores
    for nshards, exact in ((2, True), (8, True), (3, False)):  # 64/2, 64/8 multiples of 8; 64/3 not
        self_parts, pair_parts = [], []
        for k in range(nshards):
            r = shard_rows(len(x), k, nshards)
            xs = x[torch.as_tensor(r)]
            self_parts.append(
                _quiet(self_influence, model, factors, xs, y[r], ACTIVE, settings, idx[r]).scores
            )
            pair_parts.append(
                _quiet(
                    pairwise_influence,
                    *(model, factors, xs, y[r], xq, yq, ACTIVE, settings, idx[r]),
                    train_total=len(x),
                ).scores
            )
        got_self, got_pair = np.concatenate(self_parts), np.concatenate(pair_parts, axis=1)
        if exact:
            np.testing.assert_array_equal(got_self, ref_self)
            np.testing.assert_array_equal(got_pair, ref_pair)
        else:
            np.testing.assert_allclose(got_self, ref_self, rtol=1e-6)
            np.testing.assert_allclose(got_pair, ref_pair, rtol=1e-6, atol=1e-6 * np.nanmax(np.abs(ref_pair)))


@pytest.mark.parametrize("method", ["ekfac", "identity"])
def test_training_images_read_a_batch_at_a_time_give_the_same_factors_key_and_scores(tmp_path, method):
    """The influence jobs read the trained samples by rows (study_inputs.trained_samples): factors,
    their cache key and the scores equal those of the same images held whole, shards included."""
    from epochlens.data import Dataset, write_dataset
    from epochlens.data.rows import NormalizedRows, open_dataset
    from epochlens.influence.io import factor_cache_key
    from epochlens.influence.study_inputs import shard_samples

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (90, 1, 8, 8), dtype=np.uint8), rng.integers(0, 8, 90)
    data = Dataset("rows", "test", images, labels, images[:10], labels[:10], 10, 1 / 255, (0.4,), (0.3,))
    write_dataset(data, tmp_path / "dataset.h5")
    trained = np.arange(5, 90)
    whole = data.normalized("train", trained)
    rows = NormalizedRows(open_dataset(tmp_path / "dataset.h5"), "train", trained)
    model, y = _problem()[0], labels[trained]
    settings = InfluenceSettings(method=method, factor_batch_size=16, train_batch_size=16)
    fit = {"ekfac": lambda x: _quiet(fit_factors, model, x, y, ACTIVE, settings, trained)}.get(method)
    factors = None if fit is None else fit(whole)
    if fit is not None:
        for name, layer in fit(rows).layers.items():
            assert torch.equal(layer.corrected, factors.layers[name].corrected)
            assert torch.equal(layer.activation_cov, factors.layers[name].activation_cov)
    assert factor_cache_key(model, rows, y, ACTIVE, settings, trained) == factor_cache_key(
        model, whole, y, ACTIVE, settings, trained
    )
    xq, yq = whole[:7], y[:7]
    for x in (whole, rows):
        got = _quiet(self_influence, model, factors, x, y, ACTIVE, settings, trained).scores
        pair = _quiet(pairwise_influence, model, factors, x, y, xq, yq, ACTIVE, settings, trained).scores
        if x is whole:
            ref, ref_pair = got, pair
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(pair, ref_pair)
    part, y_part, idx = shard_samples(rows, y, trained, np.arange(20, 50))
    scores = _quiet(self_influence, model, factors, part, y_part, ACTIVE, settings, idx).scores
    held = _quiet(self_influence, model, factors, whole[20:50], y_part, ACTIVE, settings, idx).scores
    np.testing.assert_array_equal(scores, held)
