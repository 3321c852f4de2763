"""The workflow tests' Snakemake commands (tests/snakemake_server.py) are what `python -m snakemake`
is: the same exit status and output, and inside the Snakefile the same working directory,
environment, sys.path, sys.argv and stdin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from wfutil import SNAKEMAKE

pytestmark = pytest.mark.workflow

#: Writes what a Snakefile sees of its process to seen.json, then fails when FAIL is set.
SNAKEFILE = """
import json, os, sys
seen = {"cwd": os.getcwd(), "path": sys.path, "argv": sys.argv[1:], "stdin": sys.stdin.read(),
        "env": os.environ.get("EPOCHLENS_SERVER_TEST"), "epochlens": "epochlens" in sys.modules}
open("seen.json", "w").write(json.dumps(seen))
if os.environ.get("FAIL"):
    raise ValueError("told to fail")
rule all:
    output: "done.txt"
    shell: "echo done > {output}"
"""


def both(tmp_path, monkeypatch, args, **env) -> list[tuple[int, str, dict, Path]]:
    """(exit status, output, what the Snakefile saw, its folder) of a subprocess and of the server."""
    results = []
    for name, run in (("sub", _subprocess), ("server", SNAKEMAKE.run)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "Snakefile").write_text(SNAKEFILE)
        for key, value in {**env, "EPOCHLENS_SERVER_TEST": name}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(folder)
        proc = run(args)
        seen = json.loads((folder / "seen.json").read_text()) if (folder / "seen.json").exists() else {}
        results.append((proc.returncode, proc.stdout.replace(str(folder), "FOLDER"), seen, folder))
    return results


def _subprocess(args: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    proc.stdout += proc.stderr
    return proc


@pytest.mark.parametrize("pythonpath", [None, "extra"])
def test_a_run_sees_the_process_python_m_snakemake_would_be(tmp_path, monkeypatch, pythonpath):
    """Also when PYTHONPATH (read as the interpreter starts) is not what it was."""
    if pythonpath:
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / pythonpath))
    (sub, server) = both(tmp_path, monkeypatch, ["--cores", "1", "--quiet"])
    assert sub[0] == server[0] == 0, (sub[1], server[1])
    for result in (sub, server):
        _, _, seen, folder = result
        assert seen["cwd"] == str(folder)
        assert seen["argv"] == ["--cores", "1", "--quiet"] and seen["stdin"] == ""
        assert (folder / "done.txt").read_text() == "done\n"
    assert [p.replace(str(sub[3]), "F") for p in sub[2]["path"]] == [
        p.replace(str(server[3]), "F") for p in server[2]["path"]
    ]
    assert (sub[2]["env"], server[2]["env"]) == ("sub", "server")
    assert not server[2]["epochlens"]  # the server imported nothing of ours


def test_a_failing_snakefile_fails_the_same_way(tmp_path, monkeypatch):
    (sub, server) = both(tmp_path, monkeypatch, ["--cores", "1"], FAIL="1")
    assert sub[0] == server[0] == 1
    for _, output, _, _ in (sub, server):
        assert "told to fail" in output
    assert server[1].splitlines()[-3:] == sub[1].splitlines()[-3:]


def test_version(tmp_path, monkeypatch):
    (sub, server) = both(tmp_path, monkeypatch, ["--version"])
    assert sub[:2] == server[:2] and sub[0] == 0
