"""The comparison figure: one panel per metric and comparison, each run's seeds, mean and interval,
the differences written under the runs; and the comparison job's light imports."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from epochlens.compare import comparison_tables
from epochlens.plotting.common import save_figure
from epochlens.plotting.comparisons import plot_comparisons


def tables(tmp_path):
    plan = [
        {
            "name": "noise",
            "metrics": ["accuracy", "loss"],
            "split": "test",
            "differences": "baseline",
            "runs": [{"run": "clean", "epoch": 75}, {"run": "noisy", "epoch": 75}],
        },
        {
            "name": "strategies",
            "metrics": ["mse"],
            "split": "holdout",
            "differences": "all_pairs",
            "runs": [{"run": r, "epoch": 20} for r in ("A", "B", "C")],
        },
    ]
    values = {
        ("noise", "clean", "accuracy"): pd.Series([0.96, 0.95, 0.97]),
        ("noise", "noisy", "accuracy"): pd.Series([0.93, 0.92]),
        ("noise", "clean", "loss"): pd.Series([0.1, 0.1, 0.1]),  # no spread in either run
        ("noise", "noisy", "loss"): pd.Series([0.3, 0.3]),
        ("strategies", "A", "mse"): pd.Series([0.10, 0.11, 0.09, 0.1]),
        ("strategies", "B", "mse"): pd.Series([0.12, 0.125, 0.118, 0.121]),
        ("strategies", "C", "mse"): pd.Series([0.08, 0.1, 0.07, 0.09]),
    }
    table, long = comparison_tables(plan, values)
    # as the figure job reads them back: empty cells (the baseline's difference) as NaN
    table.to_csv(tmp_path / "t.csv", index=False)
    long.to_csv(tmp_path / "v.csv", index=False)
    return pd.read_csv(tmp_path / "t.csv", keep_default_na=False, na_values=[""]), pd.read_csv(
        tmp_path / "v.csv"
    )


def test_one_panel_per_metric_with_the_differences_under_the_runs(tmp_path):
    table, values = tables(tmp_path)
    fig = plot_comparisons(table, values)
    axes = fig.axes
    assert len(axes) == 4 and not axes[3].axison  # 2 comparisons x 2 columns; strategies has one metric
    assert axes[0].get_title() == "noise: accuracy (epoch 75)" and axes[0].get_ylabel() == "test accuracy"
    labels = [t.get_text() for t in axes[0].get_xticklabels()]
    assert labels[0] == "clean (n=3)\nbaseline"
    assert labels[1].startswith("noisy (n=2)\nΔ vs clean: -0.035\n[") and "p = " in labels[1]
    assert "(no spread: no CI)" in axes[1].get_xticklabels()[1].get_text()
    c = axes[2].get_xticklabels()[2].get_text()
    assert "Δ vs A" in c and "Δ vs B" in c and axes[2].get_ylabel() == "holdout MSE"
    assert len(axes[2].collections) >= 3  # each run's seeds
    save_figure(fig, [tmp_path / "c.png", tmp_path / "c.pdf"])
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_no_comparisons_draw_a_note():
    fig = plot_comparisons(*comparison_tables([], {}))
    assert "no comparisons configured" in fig.axes[0].texts[0].get_text()


def test_the_comparison_job_imports_no_torch_and_no_scipy_stats():
    code = "import sys, epochlens.compare; print('torch' in sys.modules, 'scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_two_seeds_accuracy_bar_ends_at_1(tmp_path):
    """Two seeds of 0.95 and 1.0 (Student-t: up to 1.29): the bar ends at 1, and the title says the
    intervals are cut to the metric's range."""
    plan = [{"name": "two", "metrics": ["accuracy"], "split": "test", "differences": "baseline",
             "runs": [{"run": "a", "epoch": 3}, {"run": "b", "epoch": 3}]}]  # fmt: skip
    values = {
        ("two", "a", "accuracy"): pd.Series([0.95, 1.0]),
        ("two", "b", "accuracy"): pd.Series([0.6, 0.9]),
    }
    table, long = comparison_tables(plan, values)
    fig = plot_comparisons(table, long)
    tops = [seg[:, 1].max() for c in fig.axes[0].collections for seg in getattr(c, "get_segments", list)()]
    assert tops and max(tops) == 1.0
    assert "intervals cut to what the metric can take" in fig.get_suptitle()
    save_figure(fig, [tmp_path / "comparisons.png"])
