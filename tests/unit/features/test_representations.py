"""The representations' maths against exact answers: fused statistics, the float64 Gram and its
chunks, subspace iteration with its convergence check and exact fallback, the deferred path that a
GPU runs (one batched eigensolver call per batch, nothing that waits for the device inside it), and
the forward pass in bfloat16."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode, resolve_name

from epochlens.errors import ConfigError
from epochlens.features import representations as reps
from epochlens.features import spectral as spec
from epochlens.features import workspace as ws
from epochlens.features.extract import extract_features
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.models.networks import ResNet18LoP, SmallCNN

#: Functions that wait for a GPU (a value or a copy on the host), or that torch runs matrix by
#: matrix there for matrices over 32 x 32 (eigh / svd / QR / checked Cholesky).
WAITS = {"__bool__", "item", "tolist", "cpu", "numpy", "nonzero"}
PER_MATRIX = {"eigvalsh", "eigh", "svdvals", "svd", "qr", "cholesky", "householder_product"}


class Calls(TorchFunctionMode):
    """The short names of the torch functions called inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append((resolve_name(func) or str(func)).rsplit(".", 1)[-1])
        return func(*args, **(kwargs or {}))


def activation_like(b: int, c: int, side: int, seed: int) -> torch.Tensor:
    """Post-ReLU maps with correlated channels (a decaying spectrum) and a dominant mean, as a
    block outputs them."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(c, c, generator=gen) / c**0.5 * torch.arange(1, c + 1) ** -0.5
    x = torch.randn(b, c, side * side, generator=gen)
    return torch.relu(mix @ x + 0.3).reshape(b, c, side, side)


def exact_top(mat: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k singular values in float64 (numpy's SVD), zero-padded."""
    sv = torch.from_numpy(np.linalg.svd(mat.double().numpy(), compute_uv=False))[:, :k]
    return torch.nn.functional.pad(sv, (0, k - sv.shape[1]))


def assert_close_to_largest(values: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    """|values - ref| <= rel x each sample's largest value."""
    err = (values.double() - ref).abs().amax(1) / ref[:, 0].clamp_min(1e-300)
    assert float(err.max()) <= rel, f"max error {float(err.max()):.2e} of the largest value > {rel:.0e}"


# --- statistics ----------------------------------------------------------------------------


def test_stats_match_numpy_in_float32_and_do_not_depend_on_chunks(monkeypatch) -> None:
    act = activation_like(20, 16, 9, seed=0) - 0.2  # negative entries too
    flat = act.flatten(1).double().numpy()
    expected = np.stack(
        [flat.mean(1), flat.std(1), flat.min(1), flat.max(1), np.sqrt((flat**2).mean(1)), (flat > 0).mean(1)],
        1,
    )
    whole = reps.simple_stats(act)
    assert whole.dtype == torch.float32
    np.testing.assert_allclose(whole.numpy(), expected, rtol=1e-6, atol=1e-7)
    monkeypatch.setattr(ws, "CPU_CHUNK_MIB", 0)  # chunks of MIN_CHUNK_SAMPLES = 8 samples: 8, 8, 4
    assert ws.sample_chunks(act, 1000) == [(0, 8), (8, 16), (16, 20)]
    torch.testing.assert_close(reps.simple_stats(act), whole, rtol=0, atol=0)


def test_std_has_no_cancellation_for_a_large_mean() -> None:
    act = 1000.0 + torch.randn(4, 8, 16, 16, generator=torch.Generator().manual_seed(1))
    std = reps.simple_stats(act)[:, 1].double()
    ref = act.double().flatten(1).std(1, correction=0)
    assert float(((std - ref) / ref).abs().max()) < 1e-4  # E[x²] - mean² in float32 would be ~1e-1 off


# --- the Gram matrix and its eigenvalues ---------------------------------------------------


def test_gram_is_float64_and_chunks_change_nothing(monkeypatch) -> None:
    a = spec.as_matrix(activation_like(20, 12, 6, seed=2))
    g = spec.gram_matrices(a)
    assert g.dtype == torch.float64
    torch.testing.assert_close(g, a.double() @ a.double().transpose(1, 2), rtol=1e-15, atol=0)
    monkeypatch.setattr(ws, "CPU_CHUNK_MIB", 0)
    assert torch.equal(spec.gram_matrices(a), g)


def test_per_matrix_threads_give_the_same_values() -> None:
    g = spec.gram_matrices(spec.as_matrix(activation_like(9, 40, 8, seed=3)))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        split = ws.per_matrix(torch.linalg.eigvalsh, g)
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, torch.linalg.eigvalsh(g))


@pytest.mark.parametrize(
    "case", ["activations", "dead_channels", "zero", "decaying", "flat_gaussian", "low_rank_wide"]
)
def test_gram_topk_agrees_with_svd(case: str, monkeypatch) -> None:
    """m = 144 > CPU_DIRECT_SIDE: subspace iteration on the CPU (and the deferred path a GPU runs),
    to 1e-7 of each sample's largest value whatever the spectrum: a flat one (a Gaussian matrix)
    fails the convergence check and gets the exact eigenvalues."""
    gen = torch.Generator().manual_seed(4)
    b, m, n, k = 6, 144, 200, 8
    if case == "activations":
        a = spec.as_matrix(activation_like(b, m, 14, seed=5))[:, :, :n]
    elif case == "dead_channels":  # rank 20 < the block of 32: the Cholesky QR must not break down
        a = spec.as_matrix(activation_like(b, m, 14, seed=6))[:, :, :n].clone()
        a[:, 20:] = 0
    elif case == "zero":
        a = torch.zeros(b, m, n)
    elif case == "decaying":
        u = torch.linalg.qr(torch.randn(b, m, m, generator=gen, dtype=torch.float64)).Q
        v = torch.linalg.qr(torch.randn(b, n, m, generator=gen, dtype=torch.float64)).Q
        a = ((u * torch.logspace(0, -6, m, dtype=torch.float64)) @ v.transpose(1, 2)).float()
    elif case == "flat_gaussian":
        a = torch.randn(b, m, n, generator=gen)
    else:  # rank 3
        a = torch.randn(b, m, 3, generator=gen) @ torch.randn(b, 3, n, generator=gen)
    ref = exact_top(a, k)
    iterated = []
    subspace_ritz = spec.subspace_ritz
    monkeypatch.setattr(spec, "subspace_ritz", lambda *args: iterated.append(1) or subspace_ritz(*args))
    cpu = spec.gram_topk(a, k)
    assert iterated and cpu.shape == (b, k) and cpu.dtype == torch.float32
    assert_close_to_largest(cpu, ref, 1e-7)
    pending = spec.gram_topk(a, k, deferred=True)
    assert pending.matrix.shape == (b, spec.SUBSPACE_BLOCK, spec.SUBSPACE_BLOCK)
    (deferred,) = spec.resolve([pending])
    assert_close_to_largest(deferred, ref, 1e-7)
    if case == "zero":
        assert (cpu == 0).all() and (deferred == 0).all()


def test_subspace_iteration_converges_at_the_documented_rate() -> None:
    """Ritz values of (G²)^t X₀ approach the eigenvalues like λ_i (λ_{q+1}/λ_i)^(4t)."""
    gen = torch.Generator().manual_seed(7)
    m, q, t = 80, 32, 3
    lam = torch.cat([torch.linspace(10, 6, 8), torch.full((m - 8,), 2.0)]).double()  # λ_{33}/λ_8 = 1/3
    u = torch.linalg.qr(torch.randn(4, m, m, generator=gen, dtype=torch.float64)).Q
    g = (u * lam) @ u.transpose(1, 2)
    ritz = torch.linalg.eigvalsh(spec.subspace_ritz(g, q, t)[:, 0]).flip(-1)[:, :8]
    err = (lam[:8] - ritz).abs() / lam[:8]
    assert (ritz <= lam[:8] * (1 + 1e-12)).all()  # lower bounds
    bound = (2.0 / lam[:8]) ** (4 * t)
    assert (err <= 100 * bound).all() and float(err.max()) > 0  # the rate, not exactness already


def test_orthonormal_handles_rank_deficient_and_zero_blocks() -> None:
    gen = torch.Generator().manual_seed(8)
    y = torch.randn(3, 50, 10, generator=gen, dtype=torch.float64)
    x = spec.orthonormal(spec.orthonormal(y))
    torch.testing.assert_close(x.transpose(1, 2) @ x, torch.eye(10, dtype=torch.float64).expand(3, 10, 10))
    deficient = y[:, :, :4] @ torch.randn(4, 10, generator=gen, dtype=torch.float64)  # rank 4
    x = spec.orthonormal(spec.orthonormal(deficient))
    assert torch.isfinite(x).all()
    s = torch.linalg.svdvals(x)
    assert torch.allclose(s[:, :4], torch.ones(3, 4, dtype=torch.float64), atol=1e-6)
    assert torch.isfinite(spec.orthonormal(torch.zeros(2, 8, 3, dtype=torch.float64))).all()


# --- the deferred path of a GPU --------------------------------------------------------------


def test_deferred_spectral_waits_for_nothing_and_solves_a_batch_in_one_call() -> None:
    """What a GPU runs, on the CPU: inside the forward pass no function that waits for the device
    or that a GPU solves matrix by matrix; after it, one batched eigvalsh for every layer (and one
    check of the subspace iteration's convergence), agreeing with the CPU's values."""
    settings = RepresentationSettings()
    layers = {  # m = 16 (whole), 64 and 128 (subspace), 192 x 196 (randomized: auto beyond 128)
        "a": activation_like(5, 16, 8, seed=9),
        "b": activation_like(5, 64, 16, seed=10),
        "c": activation_like(5, 128, 12, seed=11),
        "d": activation_like(5, 192, 14, seed=12),
    }
    for act in layers.values():  # warm the cached test matrices (a copy to the device, once)
        reps.compute(act, settings, deferred=True)
    with Calls() as inside:
        out = {name: reps.compute(act, settings, deferred=True) for name, act in layers.items()}
    assert not (set(inside.names) & (WAITS | PER_MATRIX)), sorted(set(inside.names) & (WAITS | PER_MATRIX))
    assert all(isinstance(out[name]["spectral"], spec.PendingSpectral) for name in layers)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU's threads would call eigvalsh outside this thread's recording
    try:
        with Calls() as after:
            done = reps.finish(out)
    finally:
        torch.set_num_threads(threads)
    assert after.names.count("eigvalsh") == 1 and after.names.count("__bool__") == 1
    assert "nonzero" not in after.names  # converged: no exact fallback
    for name, act in layers.items():
        ref = reps.compute(act, settings)  # the CPU's path
        assert done[name]["spectral"].shape == (5, settings.spectral_k)
        torch.testing.assert_close(done[name]["pooled"], ref["pooled"], rtol=0, atol=0)
        torch.testing.assert_close(done[name]["stats"], ref["stats"], rtol=0, atol=0)
        if name == "d":  # randomized: the same range finder, orthonormalised otherwise
            torch.testing.assert_close(done[name]["spectral"], ref["spectral"], rtol=1e-4, atol=0)
        else:
            assert_close_to_largest(done[name]["spectral"], exact_top(spec.as_matrix(act), 8), 1e-7)


def test_extraction_values_on_the_deferred_path(monkeypatch) -> None:
    """The hooks' deferred path (the default on CUDA) gives the CPU path's features."""
    torch.manual_seed(0)
    net = ResNet18LoP(10).eval()
    x = torch.randn(6, 3, 16, 16)
    cpu = extract_features(net, x, batch_size=6)
    original = reps.compute
    monkeypatch.setattr(
        reps, "compute", lambda act, settings, **kw: original(act, settings, deferred=True, **kw)
    )
    deferred = extract_features(net, x, batch_size=6)
    for layer, by_rep in cpu.items():
        for r, arr in by_rep.items():
            np.testing.assert_allclose(deferred[layer][r], arr, rtol=2e-6, atol=1e-7 * np.abs(arr).max())


def test_sketch_is_cached_per_device_and_dtype() -> None:
    first = spec.sketch_matrix(20, 4, 0, torch.float64, torch.device("cpu"))
    assert spec.sketch_matrix(20, 4, 0, torch.float64, torch.device("cpu")) is first
    assert spec.sketch_matrix(20, 4, 1, torch.float64, torch.device("cpu")) is not first


# --- the forward pass's precision ----------------------------------------------------------


def test_bfloat16_forward_stores_float32_features_close_to_float32() -> None:
    torch.manual_seed(0)
    net = SmallCNN(num_classes=4, in_channels=1).eval()
    x = torch.randn(16, 1, 8, 8)
    ref = extract_features(net, x, batch_size=8)
    low = extract_features(net, x, batch_size=8, precision="bfloat16")
    for layer, by_rep in ref.items():
        for r, arr in by_rep.items():
            assert low[layer][r].dtype == np.float32
            scale = np.abs(arr).max()
            diff = np.abs(low[layer][r] - arr).max() / scale
            assert 0 < diff < 5e-2, (layer, r, diff)  # bfloat16 keeps 8 bits: ~1e-2 (README)


def test_precision_setting_is_checked_and_keys_only_16_bit_forwards() -> None:
    with pytest.raises(ConfigError, match="precision"):
        FeatureSettings(precision="float64")
    assert "precision" not in FeatureSettings().spec()  # float32 files keep their cache key
    assert FeatureSettings(precision="bfloat16").spec()["precision"] == "bfloat16"
