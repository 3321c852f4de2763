"""Curvature of a regression's squared error against explicit per-sample Hessians (float64), the
learned threshold, and what a regression refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from epochlens.curvature.distributed import parallel_curvature
from epochlens.curvature.estimator import per_sample_curvature, rademacher_directions, regression_threshold
from epochlens.curvature.settings import CurvatureSettings
from epochlens.errors import ConfigError, EpochlensError

SHAPE = (6,)  # vector inputs
INDICES = np.arange(8) + 40
ONE_CLASS = np.zeros(1, np.int64)  # a regression's jobs pass the one pseudo-class


@pytest.fixture
def mlp() -> nn.Module:
    """6 -> 5 (tanh) -> 3 outputs, float64: smooth, so its input Hessian is not zero."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()


@pytest.fixture
def data() -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, *SHAPE, generator=g).double()
    y = torch.randn(8, 3, generator=g).double().numpy()
    return x, y


def _truth(net, x, y, settings: CurvatureSettings) -> dict[str, np.ndarray]:
    """Explicit Hessian of each sample's squared error with respect to its input."""
    n = settings.n_directions
    dirs = rademacher_directions(settings.seed, INDICES, SHAPE, n, dtype=torch.float64)
    out = {k: np.zeros(len(x)) for k in ("curvature", "eig", "loss", "grad_norm")}
    for k in range(len(x)):
        target = torch.as_tensor(y[k])

        def loss(z, target=target):
            err = (net(z.unsqueeze(0))[0] - target) ** 2
            return err.mean() if settings.reduction == "mean" else err.sum()

        hess = torch.autograd.functional.hessian(loss, x[k])
        steps = settings.h * dirs[k].reshape(n, 6)
        hv = steps @ hess
        out["curvature"][k] = hv.norm(dim=1).mean()
        out["eig"][k] = (steps * hv).sum(1).mean()
        out["loss"][k] = loss(x[k]).item()
        out["grad_norm"][k] = torch.autograd.functional.jacobian(loss, x[k]).norm()
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_exact_mode_equals_the_explicit_hessian_of_the_squared_error(mlp, data, reduction) -> None:
    x, y = data
    settings = CurvatureSettings(h=1e-3, n_directions=4, mode="exact", seed=5, reduction=reduction)
    truth = _truth(mlp, x, y, settings)
    got = per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, settings, device="cpu")
    rtol = dict(rtol=1e-6, atol=0)
    np.testing.assert_allclose(got["curvature"], truth["curvature"], **rtol)
    np.testing.assert_allclose(got["directional_eig"], truth["eig"], **rtol)
    np.testing.assert_allclose(got["loss"], truth["loss"], **rtol)
    np.testing.assert_allclose(got["grad_norm"], truth["grad_norm"], **rtol)
    assert np.isfinite(got["curvature"]).all()  # every sample: no classes to leave out
    with torch.no_grad():  # the loss is nn.MSELoss of the sample alone (mean reduction)
        mse = ((mlp(x) - torch.as_tensor(y)) ** 2).mean(1).numpy()
    if reduction == "mean":
        np.testing.assert_allclose(got["loss"], mse, rtol=1e-6)


def test_finite_differences_converge_to_the_exact_curvature(mlp, data) -> None:
    x, y = data
    exact = per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, CurvatureSettings(h=1e-4, mode="exact"))
    fd = per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, CurvatureSettings(h=1e-4))
    np.testing.assert_allclose(fd["curvature"], exact["curvature"], rtol=1e-3)


def test_a_sample_is_correct_when_its_loss_is_below_the_threshold(mlp, data) -> None:
    x, y = data
    settings = CurvatureSettings(n_directions=2)
    loose = per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, settings, loss_threshold=1e9)
    assert loose["correct"].all()
    cut = float(np.median(loose["loss"]))
    got = per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, settings, loss_threshold=cut)
    np.testing.assert_array_equal(got["correct"], loose["loss"] <= cut)
    assert not per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, settings)["correct"].any()


def test_the_threshold_is_a_tolerance_of_the_mean_predictor_loss() -> None:
    y = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 13.0]])
    var = y.var(axis=0)  # what predicting the mean costs per value
    assert regression_threshold(y, 0.1) == pytest.approx(0.1 * var.mean())
    assert regression_threshold(y, 0.5, "sum") == pytest.approx(0.5 * var.sum())
    assert regression_threshold(y[:, 0], 1.0) == pytest.approx(var[0])


def test_two_processes_give_the_same_regression_results(mlp, data) -> None:
    x, y = data
    settings = CurvatureSettings(n_directions=3)
    one = parallel_curvature(
        mlp, x, y, INDICES, ONE_CLASS, settings, torch.device("cpu"), 1, loss_threshold=0.5
    )
    two = parallel_curvature(
        mlp, x, y, INDICES, ONE_CLASS, settings, torch.device("cpu"), 2, loss_threshold=0.5
    )
    for key in one:
        np.testing.assert_array_equal(one[key], two[key])


def test_what_a_regression_refuses(mlp, data) -> None:
    x, y = data
    with pytest.raises(ConfigError, match="temperature"):
        per_sample_curvature(mlp, x, y, INDICES, ONE_CLASS, CurvatureSettings(temperature=2.0))
    with pytest.raises(EpochlensError, match=r"3 value\(s\) per sample.*got \(1, 2\)"):
        per_sample_curvature(
            nn.Sequential(nn.Linear(6, 2)).double(), x, y, INDICES, ONE_CLASS, CurvatureSettings()
        )
