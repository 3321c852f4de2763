"""Runs compared (config comparisons) as the workflow plans and runs them: the jobs a comparison
adds, a bad comparison refused before any job runs, and the comparison jobs on the runs' tables.

No run is trained here: the comparison jobs run on real data sets (prepare_data) and hand-made
accuracy tables, with only the rules that make those allowed (--allowed-rules)."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.stats
from wfutil import REPO, planned_jobs, snakemake, write_config

from epochlens.layout import Layout

pytestmark = pytest.mark.workflow

COMPARED = Layout("results")
TABLE = COMPARED.table("comparisons", "comparisons")
FIGURE = COMPARED.figure("comparisons", "png", "comparisons")


def two_runs(comparisons: list[dict]) -> dict:
    """A clean digits run with 3 seeds and the same data with 20% flipped labels with 2 (4 classes,
    +3 every 2 epochs: checkpoints 0, 2, 4, 6), trained by the pipeline."""
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
    }
    noisy = {**run, "data": {**run["data"], "corruption": {"kind": "label_flip", "fraction": 0.2}}}
    return {
        "device": "cpu",
        "runs": {"clean": {**run, "indices": [0, 1, 2]}, "noisy": {**noisy, "indices": [0, 1]}},
        "comparisons": comparisons,
    }


def test_a_comparison_plans_its_jobs_and_the_tables_they_read(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", two_runs([{"name": "noise", "runs": ["clean", "noisy"]}]))
    jobs = planned_jobs(REPO, tmp_path, str(FIGURE), configfile=cfg)
    # each run's accuracy table over its seeds (4 checkpoints each), then the comparison
    assert jobs == {
        "prepare_data": 2,
        "class_order": 5,
        "train_clean": 3,
        "train_noisy": 2,
        "evaluate_checkpoint": 20,
        "accuracy_tables": 2,
        "comparison_tables": 1,
        "plot_comparisons": 1,
    }
    everything = planned_jobs(REPO, tmp_path, configfile=cfg)
    assert everything["comparison_tables"] == everything["plot_comparisons"] == 1  # in the default target


def test_a_bad_comparison_fails_the_dry_run_with_the_key_and_the_fix(tmp_path):
    bad = [{"name": "noise", "runs": ["clean", "noisy"], "metrics": ["accuracy", "mse"]}]
    proc = snakemake(
        REPO, tmp_path, "--dry-run", configfile=write_config(tmp_path / "c.yaml", two_runs(bad)), check=False
    )
    assert proc.returncode != 0
    assert "comparisons[0] (noise).metrics: mse is a metric of regression runs, and clean is a" in proc.stdout
    cfg = two_runs([{"name": "noise", "runs": ["clean", "noisy"]}])
    cfg["runs"]["noisy"]["indices"] = [0]
    proc = snakemake(
        REPO, tmp_path, "--dry-run", configfile=write_config(tmp_path / "c.yaml", cfg), check=False
    )
    assert proc.returncode != 0
    assert (
        "run noisy has 1 replicate index ([0]); a confidence interval over indices needs 2 or more"
        in proc.stdout
    )
    assert not (tmp_path / "results").exists()


def plant_accuracy_tables(work, rng) -> dict:
    """accuracy_per_class.csv of both runs (10 classes x 4 checkpoints x seeds); returns each run's
    test accuracy per seed at the last checkpoint."""
    final = {}
    for run, indices, p in (("clean", [0, 1, 2], 0.95), ("noisy", [0, 1], 0.88)):
        rows = []
        for index in indices:
            for epoch in (0, 2, 4, 6):
                for split in ("test", "holdout"):
                    for c in range(10):
                        n = 18 if split == "test" else 5
                        k = int(rng.binomial(n, p))
                        rows.append(
                            dict(
                                index=index,
                                epoch=epoch,
                                split=split,
                                class_id=c,
                                n=n,
                                n_correct=k,
                                accuracy=k / n,
                                mean_loss=1.0 - k / n,
                            )
                        )
        table = pd.DataFrame(rows)
        path = work / COMPARED.table("accuracy_per_class", run)
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)
        last = (
            table[(table["epoch"] == 6) & (table["split"] == "test")]
            .groupby("index")[["n_correct", "n"]]
            .sum()
        )
        final[run] = (last["n_correct"] / last["n"]).to_numpy()
    return final


def test_comparison_jobs_on_the_runs_tables(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cfg = write_config(tmp_path / "c.yaml", two_runs([{"name": "noise", "runs": ["clean", "noisy"]}]))
    final = plant_accuracy_tables(work, np.random.default_rng(0))
    allowed = ("--allowed-rules", "prepare_data", "comparison_tables", "plot_comparisons")
    snakemake(REPO, work, str(FIGURE), *allowed, configfile=cfg)

    table = pd.read_csv(work / TABLE, keep_default_na=False, na_values=[""])
    assert list(zip(table["metric"], table["run"], strict=True)) == [
        ("accuracy", "clean"),
        ("accuracy", "noisy"),
        ("loss", "clean"),
        ("loss", "noisy"),
    ]
    acc = table[table["metric"] == "accuracy"].set_index("run")
    assert list(acc["n"]) == [3, 2] and list(acc["epoch"]) == [6, 6] and set(acc["split"]) == {"test"}
    ref = scipy.stats.ttest_ind(final["noisy"], final["clean"], equal_var=False)
    ci = ref.confidence_interval()
    row = acc.loc["noisy"]
    assert row["versus"] == "clean" and row["difference"] == pytest.approx(
        final["noisy"].mean() - final["clean"].mean()
    )
    assert (row["p_value"], row["difference_ci95_low"], row["difference_ci95_high"]) == pytest.approx(
        (ref.pvalue, ci.low, ci.high)
    )
    values = pd.read_csv(work / COMPARED.table("comparison_values", "comparisons"))
    assert len(values) == 2 * (3 + 2)
    assert (work / FIGURE).stat().st_size > 10_000

    # The clean and corrupted runs' data sets differ in their training labels only. Another test
    # split behind the same data section (here: edited in place) fails the job with the fix.
    with h5py.File(work / COMPARED.dataset("noisy"), "r+") as f:
        labels = f["test/labels"][()]
        f["test/labels"][...] = labels[::-1]
    proc = snakemake(REPO, work, str(TABLE), *allowed, configfile=cfg, check=False)
    assert proc.returncode != 0
    assert "comparison noise: the test samples of runs ['noisy'] differ from those of clean" in proc.stdout
