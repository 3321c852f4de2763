"""The figure jobs stay light: what they compute equals the reference, without its heavy imports."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from epochlens.stats import spearman


def test_spearman_is_scipys_without_loading_it(rng):
    """epochlens.stats.spearman equals scipy.stats.spearmanr, ties and NaN pairs included."""
    from scipy import stats as scipy_stats

    x = rng.normal(size=500)
    y = x + rng.normal(size=500)
    x[::5] = x[1]  # ties in both samples
    y[::7] = np.round(y[::7], 1)
    y[3::11] = np.nan  # pairs left out
    ok = ~np.isnan(y)
    expected = scipy_stats.spearmanr(x[ok], y[ok]).statistic
    assert spearman(x, y) == pytest.approx(expected, abs=1e-12)
    assert np.isnan(spearman([1.0, 2.0, np.nan], [2.0, 1.0, 3.0]))
    with pytest.raises(ValueError, match="different lengths"):
        spearman([1.0, 2.0, 3.0], [1.0, 2.0])


def test_curvature_figure_loads_no_scipy_stats(tmp_path):
    """The curvature vs loss figure (Spearman's rho in its titles) does not import scipy.stats."""
    code = """
import sys
import numpy as np, pandas as pd
from epochlens.plotting.curvature import plot_curvature_vs_loss
rng = np.random.default_rng(0)
n = 300
samples = pd.DataFrame({
    "index": 0, "task": rng.integers(0, 3, n), "n_epochs": 2,
    "loss_final": rng.random(n), "curvature_final": rng.random(n), "csl_mean": rng.random(n),
    "curvature_mean": rng.random(n), "epochs_to_learn": rng.integers(0, 10, n).astype(float),
})
plot_curvature_vs_loss(samples, "t").savefig(sys.argv[1])
print("scipy.stats" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "f.png")], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
