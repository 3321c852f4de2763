"""epochlens used from a project folder of the user's own, outside the checkout, the two ways the
Snakemake workflow catalog deploys a workflow: as a module of the project's Snakefile (a local
path, the form snakedeploy writes) and with ``-s <checkout>/Snakefile -d <project>``. Each plans
the demo's config and computes a real target into the project's own results/; the checkout's
results/ is not touched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from wfutil import REPO

pytestmark = pytest.mark.workflow

MODULE = f'''configfile: "config/config.yaml"


module epochlens:
    snakefile:
        "{REPO / "Snakefile"}"
    config:
        config


use rule * from epochlens as epochlens_*
'''


def _snakemake(project: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", *args]
    proc = subprocess.run(
        cmd, cwd=project, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)}: snakemake failed:\n{out[-6000:]}"
    return out


def _files(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.is_dir() else {}


@pytest.mark.parametrize("form", ["module", "-s/-d"])
def test_a_project_folder_of_its_own_plans_and_computes_into_its_results(tmp_path, form):
    project = tmp_path / "study"
    (project / "config").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", project / "config" / "config.yaml")
    args: tuple[str, ...] = ("-s", str(REPO / "Snakefile"), "-d", str(project))
    if form == "module":
        (project / "Snakefile").write_text(MODULE)
        args = ()
    checkout = _files(REPO / "results")
    plan = _snakemake(project, *args, "--dry-run")
    rule = "epochlens_prepare_data" if form == "module" else "prepare_data"
    assert f"{rule} " in plan and "train_polarity" in plan, plan[-3000:]
    _snakemake(project, *args, "results/digits/data/dataset.h5")
    with h5py.File(project / "results" / "digits" / "data" / "dataset.h5", "r") as f:
        assert len(f["train/labels"]) == 1347 and f.attrs["content_hash"]
    assert _files(REPO / "results") == checkout, "the checkout's results/ changed"
