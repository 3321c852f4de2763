"""epochlens used from a project folder of the user's own, outside the checkout, the two ways the
Snakemake workflow catalog deploys a workflow: as a module of the project's Snakefile (a local
path, the form snakedeploy writes) and with ``-s <checkout>/Snakefile -d <project>``. Each plans
the demo's config and computes a real target into the project's own results/; the checkout's
results/ is not touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest
from wfutil import REPO, snakemake

pytestmark = pytest.mark.workflow

MODULE = f'''configfile: "config/config.yaml"


module epochlens:
    snakefile:
        "{REPO / "Snakefile"}"
    config:
        config


use rule * from epochlens as epochlens_*
'''


def _files(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.is_dir() else {}


@pytest.mark.parametrize("form", ["module", "-s/-d"])
def test_a_project_folder_of_its_own_plans_and_computes_into_its_results(tmp_path, form):
    project = tmp_path / "study"
    (project / "config").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", project / "config" / "config.yaml")
    workflow = project if form == "module" else REPO  # the Snakefile run: the project's, or -s
    if form == "module":
        (project / "Snakefile").write_text(MODULE)
    checkout = _files(REPO / "results")
    plan = snakemake(workflow, project, "--dry-run").stdout
    rule = "epochlens_prepare_data" if form == "module" else "prepare_data"
    assert f"{rule} " in plan and "train_polarity" in plan, plan[-3000:]
    snakemake(workflow, project, "results/digits/data/dataset.h5")
    with h5py.File(project / "results" / "digits" / "data" / "dataset.h5", "r") as f:
        assert len(f["train/labels"]) == 1347 and f.attrs["content_hash"]
    assert _files(REPO / "results") == checkout, "the checkout's results/ changed"
