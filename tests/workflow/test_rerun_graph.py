"""The import graph is the rerun graph: editing one stage's code reruns that stage and what is
downstream of its results, nothing else; the DAG is planned without torch; a script reruns one
job by hand on a finished run's files; a second run of the same config gives identical files.

One finished tiny run (wfutil.tiny_run) with every stage on at a few epochs, its model trained by
the pipeline (the checkpoints of epochs 0, 2, 4, 6): curvature at 2 and 6, features, probes (class
target: no curvature input) and ablation at 6, influence (identity) at 6.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from digests import result_digests
from wfutil import planned_after_editing as edited
from wfutil import planned_jobs, snakemake, tiny_config, tiny_run

from epochlens.layout import RESULTS

pytestmark = pytest.mark.workflow

# The dossier reads the curvature arrays and imports curvature.dynamics (CSL, learning time).
DOSSIER = {"sample_dossier": 1, "plot_data_map": 1, "sample_explorer": 1}
DOWNSTREAM_OF_CURVATURE = {"curvature_tables": 1, "plot_curvature": 1, **DOSSIER, "all": 1}


def stages_config(ckpts: Path) -> dict:
    off_last = {"epochs": [6]}
    return tiny_config(
        ckpts,
        checkpoints={"source": "train"},
        curvature={"epochs": [2, 6]},
        features=off_last,
        probes={"targets": ["class"], "seeds": [0], "max_epochs": 20},
        ablation={**off_last, "channel_groups": 0},
        influence={"enabled": True, "methods": ["identity"], "queries": {"max_count": 4}},
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("stages"), stages_config)


def planned_after_editing(run, module: str) -> dict:
    """Jobs planned after an edit of library ``module`` of the run's workflow copy (restored)."""
    return edited(run.wf, run.work, module, configfile=run.cfg)


@pytest.mark.slow
def test_editing_a_stage_reruns_that_stage_only(finished):
    assert planned_jobs(finished.wf, finished.work, configfile=finished.cfg) == {}

    # The curvature estimator: curvature shards and what reads their results; no features,
    # probes, ablation, influence or evaluation job.
    assert planned_after_editing(finished, "curvature/estimator.py") == {
        "curvature_shard": 2,
        "curvature_epoch": 2,
        **DOWNSTREAM_OF_CURVATURE,
    }
    # Feature extraction: features and the probes on them; no curvature job.
    assert planned_after_editing(finished, "features/extract.py") == {
        "features_epoch": 1,
        "probes_epoch": 1,
        "probe_tables": 1,
        "plot_probes": 1,
        "all": 1,
    }
    assert planned_after_editing(finished, "probes/linear.py") == {
        "probes_epoch": 1,
        "probe_tables": 1,
        "plot_probes": 1,
        "all": 1,
    }
    assert planned_after_editing(finished, "ablation/ablate.py") == {
        "ablation_epoch": 1,
        "ablation_tables": 1,
        "plot_ablation": 1,
        "all": 1,
    }
    influence = planned_after_editing(finished, "influence/scores.py")
    assert influence == {
        "influence_scores": 1,
        "poison_detection": 1,
        "plot_influence": 1,
        **DOSSIER,
        "all": 1,
    }
    # A stage's tables and figures: only them.
    assert planned_after_editing(finished, "curvature/dynamics.py") == DOWNSTREAM_OF_CURVATURE
    assert planned_after_editing(finished, "plotting/probes.py") == {"plot_probes": 1, "all": 1}
    # A stage's settings module is read by the config logic, not by other stages' jobs.
    assert set(planned_after_editing(finished, "curvature/settings.py")) == {
        "curvature_shard",
        "curvature_epoch",
        *DOWNSTREAM_OF_CURVATURE,
    }


@pytest.mark.slow
def test_a_script_reruns_one_job_by_hand(finished):
    """python scripts/X.py run=... (PyPSA-Eur style) on a finished run gives the same file."""
    table = finished.work / RESULTS.eval_table("tiny", 0, 4)
    before = table.read_bytes()
    table.unlink()
    cmd = [sys.executable, str(finished.wf / "scripts" / "evaluate_checkpoint.py"), "run=tiny", "index=0"]
    cmd += ["epoch=0004", "--configfile", str(finished.cfg), "--directory", str(finished.work)]
    env = {**os.environ, "PYTHONPATH": str(finished.wf / "src")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert table.read_bytes() == before
    log = finished.work / RESULTS.log("evaluate", "tiny", 0, 4)
    assert "test accuracy" in log.read_text()


@pytest.mark.slow
def test_a_second_run_gives_identical_results(finished, tmp_path):
    """The same config run again in a fresh folder: every result file has the same content
    (tests/digests.py: timings and timestamps left out), training and figures included."""
    snakemake(finished.wf, tmp_path, configfile=finished.cfg)
    first, second = result_digests(finished.work), result_digests(tmp_path)
    assert set(first) == set(second)
    kinds = {Path(p).suffix for p in first}
    assert {".pt", ".npy", ".csv", ".json", ".png", ".pdf", ".h5", ".npz"} <= kinds, kinds
    differ = sorted(p for p in first if first[p] != second[p])
    assert not differ, f"{len(differ)} of {len(first)} result files differ: {differ[:10]}"


def test_the_dag_is_planned_without_torch(tmp_path):
    """A dry run of the embedded default imports neither torch nor matplotlib."""
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-X", "importtime", "-m", "snakemake", "--dry-run", "--cores", "1"]
    cmd += ["--snakefile", str(repo / "Snakefile"), "--directory", str(tmp_path)]
    cmd += ["--configfile", str(repo / "config" / "config.yaml")]
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Job stats:" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "epochlens.config" in imported  # the config logic ran
    assert not {"torch", "matplotlib"} & imported


def test_every_script_imports_without_snakemake():
    """Scripts define main(snakemake) behind a __main__ guard, so that importing one runs nothing."""
    import importlib.util

    scripts = Path(__file__).resolve().parents[2] / "scripts"
    sys.path.insert(0, str(scripts))
    try:
        for path in sorted(scripts.glob("[!_]*.py")):
            spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            assert callable(module.main) and module.__doc__.startswith(("Rule ", "Rules ")), path.name
            assert len(path.read_text().splitlines()) <= 80, f"{path.name}: a script is thin"
    finally:
        sys.path.remove(str(scripts))


def test_table_and_figure_scripts_import_no_torch():
    """Light jobs stay light: the scripts of tables and figures, and of every local rule (they run
    on a cluster's submit host), run without importing torch."""
    from epochlens.rule_devices import workflow_rules

    repo = Path(__file__).resolve().parents[2]
    scripts = repo / "scripts"
    named = {
        p
        for p in scripts.glob("*.py")
        if p.stem.startswith("plot_") or p.stem.endswith(("_tables", "_detection"))
    }
    # lds, regression and comparison tables and plots, and the data map, included
    assert len(named) == 18
    local = {rule.script for rule in workflow_rules(repo / "Snakefile")[0] if rule.local}
    assert named <= local, sorted(p.name for p in named - local)  # tables and plots are local rules
    code = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(scripts)!r})\n"
        "for path in sys.argv[1:]:\n"
        "    spec = importlib.util.spec_from_file_location('s', path)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(scripts.parent / "src")}
    # the scripts that keep pyarrow out (scripts/_no_pyarrow.py) apart from those that read parquet
    # (the dossier's): each job is a process of its own, one keeps pyarrow out of the next here
    no_pyarrow = {p for p in local if "_no_pyarrow" in p.read_text()}
    for group in (no_pyarrow, local - no_pyarrow):
        out = subprocess.run(
            [sys.executable, "-c", code, *map(str, sorted(group))], capture_output=True, text=True, env=env
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "False", sorted(p.name for p in group)
