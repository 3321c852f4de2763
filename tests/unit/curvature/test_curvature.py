"""Unit tests of the curvature engine against exact answers on tiny models (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from epochlens.curvature.estimator import full_fp32_precision, per_sample_curvature, rademacher_directions
from epochlens.curvature.settings import DIRECTION_SCHEME, CurvatureSettings
from epochlens.errors import ConfigError, EpochlensError
from epochlens.models.networks import ResNet18LoP, SmallCNN

SHAPE = (1, 2, 3)  # one tiny "image": 6 input dimensions
ACTIVE = np.array([3, 0, 1])  # trained classes, in class-order position
LABELS = np.array([0, 3, 1, 2, 3, 1, 0])  # label 2 is not active -> NaN for sample 3
INDICES = np.arange(7) + 100  # global indices (seed the directions)


@pytest.fixture
def mlp() -> nn.Module:
    """6 -> 5 (tanh) -> 4 logits, float64: smooth, so finite differences converge to H v."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4))
    return net.double()


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(len(LABELS), *SHAPE, generator=torch.Generator().manual_seed(1)).double()


def _per_sample_loss(net: nn.Module, x: torch.Tensor, target: int, temperature: float):
    """Loss of one sample x (shape SHAPE) as a function for autograd.functional."""
    logits = net(x.unsqueeze(0))[:, torch.as_tensor(ACTIVE)] / temperature
    return F.cross_entropy(logits, torch.tensor([target]))


def _ground_truth(net, images, settings: CurvatureSettings) -> dict[str, np.ndarray]:
    """Explicit per-sample Hessians (float64), directions from rademacher_directions."""
    h, n, temperature = settings.h, settings.n_directions, settings.temperature
    truth = {k: np.full(len(LABELS), np.nan) for k in ("curvature", "curvature_sq", "eig")}
    truth.update(fd_sq=truth["curvature"].copy(), loss=truth["curvature"].copy())
    truth["grad_norm"] = truth["curvature"].copy()
    dirs = rademacher_directions(settings.seed, INDICES, SHAPE, n, dtype=torch.float64)
    for k, label in enumerate(LABELS):
        if label not in ACTIVE:
            continue
        target = int(np.flatnonzero(ACTIVE == label)[0])

        def loss(z, target=target):
            return _per_sample_loss(net, z, target, temperature)

        x = images[k]
        hess = torch.autograd.functional.hessian(loss, x).reshape(6, 6)
        steps = h * dirs[k].reshape(n, 6)  # (n, 6) = h v_i
        hv = steps @ hess  # H symmetric: rows are (H h v_i)^T
        truth["curvature"][k] = hv.norm(dim=1).mean()
        truth["curvature_sq"][k] = (hv.norm(dim=1) ** 2).mean()
        truth["eig"][k] = (steps * hv).sum(1).mean()
        grad = torch.autograd.functional.jacobian(loss, x).reshape(6)
        fd = torch.stack(
            [torch.autograd.functional.jacobian(loss, x + s.view(SHAPE)).reshape(6) for s in steps]
        )
        truth["fd_sq"][k] = ((fd - grad) ** 2).sum(1).mean()
        truth["loss"][k] = loss(x).item()
        truth["grad_norm"][k] = grad.norm()
    return truth


def _run(net, images, **kwargs) -> dict[str, np.ndarray]:
    settings = CurvatureSettings(**kwargs)
    return per_sample_curvature(net, images, LABELS, INDICES, ACTIVE, settings, device="cpu")


def _assert_close(actual, expected, rtol=1e-6):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=0, equal_nan=True)


# --- directions ---------------------------------------------------------------------------------


def test_directions_are_a_function_of_seed_and_index():
    idx = np.array([5, 0, 17, 3])
    dirs = rademacher_directions(7, idx, (3, 4, 5), 6)
    assert dirs.shape == (4, 6, 3, 4, 5) and dirs.dtype == torch.float32
    assert set(dirs.unique().tolist()) == {-1.0, 1.0}
    # Any subset or order of indices gets the same directions per sample.
    again = rademacher_directions(7, idx[[2, 0]], (3, 4, 5), 6)
    assert torch.equal(again, dirs[[2, 0]])
    # The first n directions do not depend on how many are drawn.
    assert torch.equal(rademacher_directions(7, idx, (3, 4, 5), 2), dirs[:, :2])
    # Seeds, samples and directions differ from one another.
    assert not torch.equal(rademacher_directions(8, idx, (3, 4, 5), 6), dirs)
    flat = dirs.reshape(-1, 60)
    assert len({tuple(row.tolist()) for row in flat}) == len(flat)
    assert abs(float(dirs.mean())) < 0.1  # balanced signs
    # int8 output holds the same values.
    assert torch.equal(rademacher_directions(7, idx, (3, 4, 5), 6, torch.int8).float(), dirs)


def _splitmix_reference(seed: int, index: int, n: int, numel: int) -> list[list[int]]:
    """The documented scheme, in plain Python integers."""
    mask = 2**64 - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    key = mix(index ^ mix(seed % 2**64))
    words = -(-numel // 64)
    out = []
    for i in range(n):
        bits = []
        for w in range(words):
            word = mix((key + (i * words + w + 1) * 0x9E3779B97F4A7C15) & mask)
            bits += [(word >> b) & 1 for b in range(64)]
        out.append([1 - 2 * b for b in bits[:numel]])
    return out


def test_directions_follow_the_documented_scheme():
    """Changing the scheme changes every stored result: it must be deliberate (bump the name)."""
    assert DIRECTION_SCHEME == "splitmix64-rademacher-v1"
    idx = np.array([0, 2**40])
    dirs = rademacher_directions(-3, idx, (2, 5, 7), 3, torch.int8)  # 70 elements: 2 words
    for k, index in enumerate(idx):
        expected = _splitmix_reference(-3, int(index), 3, 70)
        assert dirs[k].reshape(3, 70).tolist() == expected


def test_directions_reject_negative_indices():
    with pytest.raises(ValueError, match="non-negative"):
        rademacher_directions(0, np.array([-1]), SHAPE, 2)


# --- exact answers ------------------------------------------------------------------------------


def test_exact_mode_matches_explicit_hessian(mlp, images):
    settings = CurvatureSettings(h=1e-3, n_directions=5, mode="exact", seed=3)
    truth = _ground_truth(mlp, images, settings)
    got = _run(mlp, images, h=1e-3, n_directions=5, mode="exact", seed=3)
    _assert_close(got["curvature"], truth["curvature"])
    _assert_close(got["directional_eig"], truth["eig"])
    _assert_close(got["loss"], truth["loss"])
    _assert_close(got["grad_norm"], truth["grad_norm"])
    # Sample 3's label (2) is not an active class: not computed.
    assert np.isnan(got["curvature"][3]) and not got["correct"][3]
    assert all(got[k].dtype == np.float32 for k in ("curvature", "directional_eig", "loss"))
    assert got["correct"].dtype == bool


def test_correctness_is_argmax_of_active_logits(mlp, images):
    got = _run(mlp, images, n_directions=1)
    logits = mlp(images)[:, torch.as_tensor(ACTIVE)].argmax(1).numpy()
    expected = np.array([lab in ACTIVE and ACTIVE[p] == lab for p, lab in zip(logits, LABELS, strict=True)])
    np.testing.assert_array_equal(got["correct"], expected)


def test_finite_difference_converges_linearly_to_exact(mlp, images):
    errors = []
    for h in (1e-2, 1e-3, 1e-4):
        truth = _ground_truth(mlp, images, CurvatureSettings(h=h, n_directions=4))
        got = _run(mlp, images, h=h, n_directions=4)
        active = ~np.isnan(truth["curvature"])
        rel = np.abs(got["curvature"] - truth["curvature"])[active] / truth["curvature"][active]
        errors.append(rel.max())
    assert errors[0] < 3e-2
    # Error ~ c*h: each tenfold smaller step gives ~tenfold smaller error.
    assert 5 < errors[0] / errors[1] < 20 and 5 < errors[1] / errors[2] < 20


def test_l2_squared_is_mean_of_squared_norms(mlp, images):
    settings = CurvatureSettings(h=1e-2, n_directions=3, norm="l2_squared")
    truth = _ground_truth(mlp, images, settings)
    # Finite differences against g(x + h v) - g(x) computed sample by sample.
    _assert_close(_run(mlp, images, h=1e-2, n_directions=3, norm="l2_squared")["curvature"], truth["fd_sq"])
    exact = _run(mlp, images, h=1e-2, n_directions=3, norm="l2_squared", mode="exact")
    _assert_close(exact["curvature"], truth["curvature_sq"])


def test_temperature_divides_logits(mlp, images):
    settings = CurvatureSettings(n_directions=3, mode="exact", temperature=2.5)
    truth = _ground_truth(mlp, images, settings)
    got = _run(mlp, images, n_directions=3, mode="exact", temperature=2.5)
    _assert_close(got["curvature"], truth["curvature"])
    _assert_close(got["loss"], truth["loss"])
    plain = _run(mlp, images, n_directions=3, mode="exact")
    assert not np.allclose(plain["loss"][0], got["loss"][0])


# --- invariances --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["finite_difference", "exact"])
def test_batch_size_and_chunking_do_not_change_results(mlp, images, mode):
    full = _run(mlp, images, mode=mode, batch_size=len(LABELS))
    for batch_size, max_batch in ((1, None), (3, None), (3, 1), (7, 4)):
        got = _run(mlp, images, mode=mode, batch_size=batch_size, max_batch=max_batch)
        for key in ("curvature", "directional_eig", "loss", "grad_norm"):
            _assert_close(got[key], full[key])
        np.testing.assert_array_equal(got["correct"], full["correct"])


def test_shards_concatenate_to_the_full_run(mlp, images):
    settings = CurvatureSettings(seed=11)
    full = per_sample_curvature(mlp, images, LABELS, INDICES, ACTIVE, settings, progress=True)
    for k in (1, 4):
        head = per_sample_curvature(mlp, images[:k], LABELS[:k], INDICES[:k], ACTIVE, settings)
        tail = per_sample_curvature(mlp, images[k:], LABELS[k:], INDICES[k:], ACTIVE, settings)
        for key in full:
            np.testing.assert_allclose(
                np.concatenate([head[key], tail[key]]), full[key], rtol=1e-6, equal_nan=True
            )


def test_seed_changes_directions_not_loss(mlp, images):
    a, b = _run(mlp, images, seed=0), _run(mlp, images, seed=1)
    assert not np.allclose(a["curvature"][0], b["curvature"][0])
    _assert_close(a["loss"], b["loss"])


# --- errors -------------------------------------------------------------------------------------


def test_nan_input_names_the_sample(mlp, images):
    images = images.clone()
    images[2, 0, 1, 1] = float("nan")
    with pytest.raises(EpochlensError, match=r"sample indices \[102\]"):
        _run(mlp, images)
    # A NaN in a sample of an inactive class is harmless: that sample is not computed.
    images[2] = 0.0
    images[3, 0, 0, 0] = float("inf")
    assert np.isnan(_run(mlp, images)["curvature"][3])


def test_nan_weight_names_the_parameter(mlp, images):
    with torch.no_grad():
        mlp[3].weight[1, 2] = float("nan")
    with pytest.raises(EpochlensError, match=r"3\.weight"):
        _run(mlp, images)


def test_nan_buffer_names_the_buffer():
    net = SmallCNN(num_classes=4).eval()
    net.block2[1].running_var[3] = float("inf")
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(EpochlensError, match=r"block2\.1\.running_var"):
        per_sample_curvature(net, x, np.array([0, 1]), np.arange(2), np.arange(4))


def test_non_finite_results_are_never_written(images):
    class LogModel(nn.Module):  # log of a negative input: NaN logits from finite inputs/weights
        def forward(self, x):
            return torch.log(x.flatten(1)[:, :4] + 10.0 * (x.flatten(1)[:, 4:5] > 0))

    with pytest.raises(EpochlensError, match="NaN or Inf for sample indices"):
        per_sample_curvature(LogModel().double(), images, LABELS, INDICES, ACTIVE)


def test_active_class_outside_the_model_is_a_config_error(mlp, images):
    with pytest.raises(ConfigError, match="4 outputs"):
        per_sample_curvature(mlp, images, LABELS, INDICES, np.array([0, 7]))


@pytest.mark.parametrize(
    "kwargs",
    [{"h": 0.0}, {"n_directions": 0}, {"temperature": -1.0}, {"norm": "l1"}, {"mode": "x"}],
)
def test_invalid_settings(kwargs):
    with pytest.raises(ConfigError):
        CurvatureSettings(**kwargs)


def test_estimator_metadata_records_what_results_depend_on():
    meta = CurvatureSettings(h=1e-2, n_directions=4, seed=9).estimator_metadata()
    assert meta["h"] == 1e-2 and meta["n_directions"] == 4 and meta["seed"] == 9
    assert meta["directions"] == DIRECTION_SCHEME and "g(x+h*v_i)-g(x)" in meta["formula_curvature"]
    assert "batch_size" not in meta


def _tf32_flags() -> tuple[list[tuple[object, str]], object, object]:
    """CUDA float32 precision flags as (object, attribute), their value with TF32 off, and on."""
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9
        attr = "fp32_precision"
        return (
            [(torch.backends.cuda.matmul, attr), (torch.backends.cudnn.conv, attr)],
            "ieee",
            "tf32",
        )
    attr = "allow_tf32"
    return [(torch.backends.cuda.matmul, attr), (torch.backends.cudnn, attr)], False, True


def test_fp32_precision_flags_are_restored():
    flags, off, _ = _tf32_flags()
    before = [getattr(obj, name) for obj, name in flags]
    with full_fp32_precision():
        assert [getattr(obj, name) for obj, name in flags] == [off, off]
    assert [getattr(obj, name) for obj, name in flags] == before


# --- real architectures -------------------------------------------------------------------------


def test_small_cnn_uses_eval_mode_and_leaves_the_model_alone():
    torch.manual_seed(0)
    net = SmallCNN(num_classes=6)
    net.train()
    for bn in (net.block1[1], net.block2[1]):  # non-trivial running statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(4, 1, 8, 8)
    labels, active = np.array([0, 1, 5, 2]), np.array([0, 1, 2, 3])
    got = per_sample_curvature(net, x, labels, np.arange(4), active, CurvatureSettings(seed=1))
    assert net.training and all(p.requires_grad for p in net.parameters())
    with torch.no_grad():
        logits = net.eval()(x)[:, :4]
    expected = F.cross_entropy(logits[[0, 1, 3]], torch.tensor([0, 1, 2]), reduction="none")
    np.testing.assert_allclose(got["loss"][[0, 1, 3]], expected.numpy(), rtol=1e-5)
    assert np.isnan(got["curvature"][2])
    assert np.isfinite(got["curvature"][[0, 1, 3]]).all()
    assert (got["curvature"][[0, 1, 3]] > 0).all()


def test_small_cnn_float64_batch_invariance():
    torch.manual_seed(0)
    net = SmallCNN(num_classes=4).double().eval()
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    labels, idx, active = np.array([0, 1, 2, 3, 1]), np.arange(5), np.arange(4)
    settings = CurvatureSettings(n_directions=3, batch_size=5)
    full = per_sample_curvature(net, x, labels, idx, active, settings)
    small = per_sample_curvature(
        net, x, labels, idx, active, CurvatureSettings(n_directions=3, batch_size=2, max_batch=3)
    )
    for key in ("curvature", "directional_eig", "loss", "grad_norm"):
        np.testing.assert_allclose(small[key], full[key], rtol=1e-6)


@pytest.mark.parametrize("mode", ["finite_difference", "exact"])
def test_resnet18_lop_on_tiny_inputs(mode):
    torch.manual_seed(0)
    net = ResNet18LoP(num_classes=10)
    x = torch.randn(2, 3, 8, 8)
    settings = CurvatureSettings(n_directions=2, mode=mode)
    got = per_sample_curvature(net, x, np.array([3, 7]), np.array([0, 1]), np.arange(10), settings)
    for key in ("curvature", "loss", "grad_norm"):
        assert np.isfinite(got[key]).all() and (got[key] >= 0).all()


def test_out_of_memory_halves_the_chunk_and_retries(mlp, images):
    class Picky(nn.Module):  # runs out of "memory" beyond 3 rows per pass
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if len(x) > 3:
                raise torch.cuda.OutOfMemoryError("simulated")
            return self.inner(x)

    expected = _run(mlp, images, max_batch=2)
    with pytest.warns(UserWarning, match="retrying with 3"):
        got = _run(Picky(mlp), images, max_batch=7)
    for key in ("curvature", "directional_eig", "loss"):
        _assert_close(got[key], expected[key])


# --- GPU (skipped without CUDA) -----------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("mode", ["finite_difference", "exact"])
def test_cuda_matches_cpu_in_float64(mlp, images, mode):
    cpu = _run(mlp, images, mode=mode)
    gpu = per_sample_curvature(
        mlp, images, LABELS, INDICES, ACTIVE, CurvatureSettings(mode=mode), device="cuda"
    )
    for key in ("curvature", "directional_eig", "loss", "grad_norm"):
        _assert_close(gpu[key], cpu[key])


@cuda
def test_cuda_float32_runs_without_tf32():
    """TF32 (10-bit mantissa) would swamp the finite difference; the engine turns it off."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 10))
    x = torch.randn(16, 1, 8, 8)
    labels, idx, active = np.arange(16) % 10, np.arange(16), np.arange(10)
    settings = CurvatureSettings(h=1e-2)
    truth = per_sample_curvature(net.double(), x.double(), labels, idx, active, settings, "cpu")
    flags, _, on = _tf32_flags()
    matmul, name = flags[0]
    saved = getattr(matmul, name)
    setattr(matmul, name, on)  # a user who asked for TF32 globally
    try:
        got = per_sample_curvature(net.float(), x, labels, idx, active, settings, "cuda")
        assert getattr(matmul, name) == on  # restored afterwards
    finally:
        setattr(matmul, name, saved)
    np.testing.assert_allclose(got["curvature"], truth["curvature"], rtol=1e-3)
