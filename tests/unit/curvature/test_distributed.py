"""Curvature split over processes with torch.distributed (gloo on this CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.curvature.distributed import check_processes, parallel_curvature
from epochlens.curvature.settings import CurvatureSettings
from epochlens.errors import ConfigError, EpochlensError
from epochlens.models.networks import SmallCNN

pytestmark = pytest.mark.slow  # starts processes

ACTIVE = np.array([4, 1, 7])


@pytest.fixture(scope="module")
def problem():
    torch.manual_seed(0)
    model = SmallCNN(num_classes=10, in_channels=1).double()
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(11, 1, 8, 8, generator=gen).double()
    labels = np.array([4, 1, 7, 0, 4, 4, 1, 7, 7, 2, 1])  # 0 and 2 inactive -> NaN
    indices = np.arange(11) + 500
    return model, images, labels, indices


def test_two_processes_give_the_same_arrays_as_one(problem):
    model, images, labels, indices = problem
    settings = CurvatureSettings(n_directions=4, batch_size=3)
    one = parallel_curvature(model, images, labels, indices, ACTIVE, settings, torch.device("cpu"), 1)
    two = parallel_curvature(model, images, labels, indices, ACTIVE, settings, torch.device("cpu"), 2)
    assert set(one) == set(two) == {"curvature", "directional_eig", "loss", "grad_norm", "correct"}
    for key in one:
        np.testing.assert_array_equal(one[key], two[key], err_msg=key)
    active = np.isin(labels, ACTIVE)
    assert np.isnan(two["curvature"][~active]).all() and np.isfinite(two["curvature"][active]).all()


def test_an_error_on_one_rank_names_the_sample(problem):
    model, images, labels, indices = problem
    bad = images.clone()
    bad[8, 0, 2, 2] = float("nan")  # in rank 1's block (samples 6..10)
    with pytest.raises(EpochlensError, match=r"rank 1: .*508"):
        parallel_curvature(
            model, bad, labels, indices, ACTIVE, CurvatureSettings(n_directions=2), torch.device("cpu"), 2
        )


def test_process_count_checks():
    with pytest.raises(ConfigError, match="processes=0"):
        check_processes(0, torch.device("cpu"))
    with pytest.raises(ConfigError, match="CUDA devices"):
        check_processes(torch.cuda.device_count() + 1, torch.device("cuda"))
