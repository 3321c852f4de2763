"""The workflow's own lint, in the test suite (so CI runs it, not only `make lint`): Snakemake's
linter (rules with logs, no absolute paths, params not built from strings, ...) and snakefmt's
formatting of the Snakefile and rules/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from wfutil import REPO

pytestmark = pytest.mark.workflow


def _run(*cmd: str) -> tuple[int, str]:
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_snakemake_lint_finds_nothing():
    code, out = _run(sys.executable, "-m", "snakemake", "--lint")
    assert code == 0 and "Congratulations, your workflow is in a good condition!" in out, out[-4000:]


def test_the_snakefile_and_rules_are_formatted_by_snakefmt():
    code, out = _run(str(Path(sys.executable).parent / "snakefmt"), "--check", "Snakefile", "rules")
    assert code == 0, f"run `snakefmt Snakefile rules`:\n{out[-4000:]}"
