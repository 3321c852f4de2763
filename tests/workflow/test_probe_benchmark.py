"""benchmarks/probes.py --parts pipeline at its small size: the whole run of stored activations
through Snakemake (9 representations, the user's among them, 10 ridge probe seeds) writes every
probe, and the benchmark reports each rule's jobs from their ``benchmark:`` files.

The benchmark runs as a user runs it (its own process, which runs snakemake), not imported: it
sets torch's threads, which would stay set in this test worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from quality import SEED, above, below
from wfutil import REPO

pytestmark = pytest.mark.workflow

LAYERS, DIMS, TOKENS, SEEDS = 4, 32, 4, 10
#: Width of each representation of (4 tokens, 32 dims): the token reductions and the user's
#: (benchreps.pool:l2_mean) 32, norms one per token, flat all 128, stats six, spectral rank 4.
WIDTHS = {"mean": 32, "max": 32, "first": 32, "last": 32, "norms": 4, "flat": 128, "stats": 6}
WIDTHS |= {"spectral": 4, "benchreps.pool:l2_mean": 32}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bench")
    argv = ["--parts", "pipeline", "--layers", str(LAYERS), "--samples", "600", "--dims", str(DIMS)]
    argv += ["--data-seed", str(SEED)]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "probes.py"), *argv, "--keep", "--dir", str(tmp)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.quality
def test_every_probe_of_the_run_is_written(report):
    assert report["size"]["tokens"] == TOKENS  # the pipeline part's default shape: 4 tokens
    rows = report["pipeline"]["probe_rows"]
    assert rows["eval_sets"] == ["holdout", "test"]
    assert rows["per_seed_rows"] == rows["expected"] == LAYERS * len(WIDTHS) * SEEDS * 2
    assert rows["summary_rows"] == LAYERS * len(WIDTHS) * 2 and rows["complete"]
    work = Path(report["pipeline"]["working_directory"])
    summary = pd.read_csv(work / "results" / "bench" / "tables" / "probes.csv")
    widths = summary.groupby("representation")["n_features"].unique()
    assert {rep: list(w) for rep, w in widths.items()} == {rep: [w] for rep, w in WIDTHS.items()}
    assert (summary["n_seeds"] == SEEDS).all()
    # labels aligned with the activations: the middle layers (the synthetic class signal's peak)
    # far above chance (0.1) in the tokens' representations, the outer layers (signal 0.05) not:
    # 0.38-0.86 and 0.10-0.15 over the measured draws of the data (docs/development.md)
    test = summary[summary["eval_split"] == "test"].set_index(["representation", "layer"])["accuracy_mean"]
    for rep in ("mean", "flat", "benchreps.pool:l2_mean"):
        above(
            f"{rep}: test accuracy, worse of layers 1 and 2",
            min(test[rep, "layer_1"], test[rep, "layer_2"]),
            0.2,
        )
        below(f"{rep}: test accuracy, layer 0", test[rep, "layer_0"], 0.25)


def test_each_rule_is_timed_from_its_jobs_benchmark_files(report):
    rules = report["pipeline"]["rules"]
    assert {r: v["jobs"] for r, v in rules.items()} == {
        "prepare_data": 1, "features_stored": 9, "probes_stored": 9, "probe_tables": 1, "plot_probes": 1,
    }  # fmt: skip
    for rule in rules.values():
        assert 0 < rule["seconds_max"] <= rule["seconds_sum"]
        # None where every job ended before Snakemake's first memory sample (0.5 s), never 0
        assert rule["max_rss_mb"] is None or rule["max_rss_mb"] > 0
    assert any(rule["max_rss_mb"] for rule in rules.values())
    assert report["pipeline"]["wall_seconds"] > rules["features_stored"]["seconds_max"]
