"""The house rules run in the suite (so CI runs them, not only ``make lint``): ruff's lint and
formatting of every Python folder, with the complexity limits of pyproject.toml (C901
max-complexity, PLR0915 max-statements: issue 35 lowered them as functions were split), and the
workflow's: Snakemake's linter and snakefmt's formatting of the Snakefile and rules/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FOLDERS = ("src", "scripts", "tests", "benchmarks", "docs")


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *FOLDERS], cwd=REPO, capture_output=True, text=True
    )


def test_the_complexity_rules_are_on():
    text = (REPO / "pyproject.toml").read_text()  # read as text: tomllib needs Python 3.11
    select = re.search(r"^select = \[(.*)\]$", text, re.M)[1]
    assert '"C901"' in select and '"PLR0915"' in select
    assert int(re.search(r"^max-complexity = (\d+)$", text, re.M)[1]) <= 12
    assert int(re.search(r"^max-statements = (\d+)$", text, re.M)[1]) <= 47


def test_ruff_check_passes():
    proc = ruff("check", "--no-cache")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_check_passes():
    proc = ruff("format", "--check", "--no-cache")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _workflow_tool(*cmd: str) -> tuple[int, str]:
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_snakemake_lint_finds_nothing():
    code, out = _workflow_tool(sys.executable, "-m", "snakemake", "--lint")
    assert code == 0 and "Congratulations, your workflow is in a good condition!" in out, out[-4000:]


def test_the_snakefile_and_rules_are_formatted_by_snakefmt():
    code, out = _workflow_tool(str(Path(sys.executable).parent / "snakefmt"), "--check", "Snakefile", "rules")
    assert code == 0, f"run `snakefmt Snakefile rules`:\n{out[-4000:]}"
