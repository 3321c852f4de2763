"""The workflow tests' script jobs, forked from tests/job_server.py, are what Snakemake's own
``python <script>`` is: the same working directory, sys.path, environment, thread counts and exit
status, a failure's traceback from the script's frame on; and they run forked (the libraries
imported already, pandas not), not with the real interpreter."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from wfutil import JOBS, SNAKEMAKE

pytestmark = pytest.mark.workflow

SNAKEFILE = """
rule all:
    output: "seen.json"
    threads: 2
    script: "see.py"
"""
#: What a script job sees of its process, then a failure when FAIL is set.
SCRIPT = """
import json, os, sys
preloaded = "torch" in sys.modules
import torch
seen = {
    "cwd": os.getcwd(), "path": sys.path, "argv": len(sys.argv), "env": os.environ.get("SEEN"),
    "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
    "preloaded": preloaded, "pandas": "pandas" in sys.modules, "main": __name__,
}
json.dump(seen, open(snakemake.output[0], "w"))
if os.environ.get("FAIL"):
    raise ValueError("told to fail")
"""


def both(tmp_path, monkeypatch, **env) -> list[tuple[int, str, dict, Path]]:
    """(exit status, output, what the script saw, its folder): Snakemake's own start, then forked."""
    results = []
    for name, launcher in (("own", None), ("forked", JOBS.launcher)):
        folder = tmp_path / name
        folder.mkdir(parents=True)
        (folder / "Snakefile").write_text(SNAKEFILE)
        (folder / "see.py").write_text(SCRIPT)
        for key, value in {**env, "SEEN": name}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(folder)
        proc = SNAKEMAKE.run(["--cores", "2", "--show-failed-logs"], launcher)
        seen = json.loads((folder / "seen.json").read_text()) if (folder / "seen.json").exists() else {}
        results.append((proc.returncode, proc.stdout, seen, folder))
    return results


def _path(result) -> list[str]:
    """The job's sys.path, its folder and Snakemake's temporary source cache named alike."""
    path = [p.replace(str(result[3]), "F") for p in result[2]["path"]]
    return [re.sub(r"runtime-cache/tmp[^/]+", "runtime-cache/T", p) for p in path]


def test_a_forked_job_sees_the_process_its_own_interpreter_would_be(tmp_path, monkeypatch):
    (own, forked) = both(tmp_path, monkeypatch)
    assert own[0] == forked[0] == 0, (own[1], forked[1])
    assert _path(own) == _path(forked)
    for result, name in ((own, "own"), (forked, "forked")):
        seen = result[2]
        assert seen["cwd"] == str(result[3]) and seen["env"] == name and seen["main"] == "__main__"
        assert (seen["threads"], seen["omp"], seen["argv"]) == (2, "2", 1)
        assert not seen["pandas"]
    assert (own[2]["preloaded"], forked[2]["preloaded"]) == (False, True)


def test_a_failing_job_fails_the_same_way(tmp_path, monkeypatch):
    (own, forked) = both(tmp_path, monkeypatch, FAIL="1")
    assert own[0] == forked[0] == 1
    tracebacks = [_traceback(result) for result in (own, forked)]
    assert tracebacks[0] == tracebacks[1]
    assert tracebacks[0][-1] == "ValueError: told to fail" and len(tracebacks[0]) == 4


def _traceback(result) -> list[str]:
    """The job's traceback, its folder and script's temporary name alike."""
    output = result[1].replace(str(result[3]), "F")
    lines = output[output.index("Traceback") :].splitlines()
    end = next(k for k, line in enumerate(lines) if line.startswith("ValueError"))
    return [re.sub(r"tmp\w+\.see", "T.see", line) for line in lines[: end + 1]]


def test_jobs_stay_forked_after_the_test_process_imports_the_trainer(tmp_path, monkeypatch):
    """Importing transformers' Trainer sets TORCHINDUCTOR_CACHE_DIR in the importing process: with
    the server already started, a test that did so (the text runs' fixtures) once sent every later
    job of its worker to the real interpreter. An import-time variable (HF_HUB_OFFLINE) still does."""
    JOBS.launcher  # noqa: B018 (started before the variable is set, as in a worker)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (_, forked) = both(tmp_path / "cache", monkeypatch)
    assert forked[0] == 0 and forked[2]["preloaded"], forked[1]
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    (_, real) = both(tmp_path / "hub", monkeypatch)
    assert real[0] == 0 and not real[2]["preloaded"]
    assert "job server (tests/job_server.py): not forked, HF_HUB_OFFLINE differ" in real[1]
