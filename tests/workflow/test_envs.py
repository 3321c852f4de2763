"""The conda environments of envs/ (snakemake --sdm conda) build what the tests ran with.

No conda channel is reachable here, so each file is checked against what pip installed in the
environment running the tests: every package pinned to the version installed here (conda names
mapped to pip's), Python's minor version the same as the one running snakemake (the jobs' scripts
import snakemake's own modules from it), conda-forge only, nothing installed from a path or in
editable mode. And every rule's script imports nothing its environment lacks.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from wfutil import REPO

from epochlens.provenance import module_sources

ENV_FILES = sorted((REPO / "envs").glob("*.yaml"))
# conda-forge name -> pip distribution name, where they differ
PIP_NAME = {"pytorch": "torch", "matplotlib-base": "matplotlib", "pyyaml": "PyYAML"}
# import name -> conda-forge name, where they differ
CONDA_NAME = {
    "torch": "pytorch",
    "sklearn": "scikit-learn",
    "matplotlib": "matplotlib-base",
    "yaml": "pyyaml",
    "PIL": "pillow",
}
# conda packages with no pip counterpart: which CUDA runtime the CUDA build of pytorch gets
CONDA_ONLY = {"cuda-version"}
# name, then optionally =version, ==version or a bound, then optionally =build
SPEC = re.compile(
    r"^(?P<name>[A-Za-z0-9_.-]+)\s*(?P<op>==|=|>=|<=|>|<)?\s*(?P<version>[^=\s,]+)?(?:=(?P<build>\S+))?$"
)


def dependencies(path: Path) -> dict[str, dict]:
    """{conda name: {op, version, build}} of an environment file (the pip section rejected)."""
    env = yaml.safe_load(path.read_text())
    specs = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), f"{path.name}: {dep!r}: no pip section, conda-forge packages only"
        m = SPEC.match(dep)
        assert m, f"{path.name}: cannot read {dep!r}"
        specs[m["name"].lower()] = m.groupdict()
    return specs


def installed(pip_name: str) -> str:
    """Version pip installed here, without a local label (2.13.0+cpu -> 2.13.0)."""
    return metadata.version(pip_name).split("+")[0]


def test_there_are_environment_files():
    assert {p.name for p in ENV_FILES} == {"epochlens.yaml", "plots.yaml"}


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_environment_pins_what_the_tests_ran_with(path):
    env = yaml.safe_load(path.read_text())
    assert env["channels"] == ["conda-forge", "nodefaults"], "conda-forge only (no defaults, no pytorch)"
    text = path.read_text()
    assert "-e " not in text and "../" not in text and "pip:" not in text, "no path or editable installs"
    specs = dependencies(path)
    python = specs.pop("python")
    assert python["version"] == f"{sys.version_info.major}.{sys.version_info.minor}", python
    for name, spec in specs.items():
        if name in CONDA_ONLY:
            continue
        assert spec["op"] in ("=", "=="), f"{path.name}: {name} is not pinned ({spec})"
        assert spec["version"] == installed(PIP_NAME.get(name, name)), (
            f"{path.name}: {name}={spec['version']}, but the tests ran with "
            f"{PIP_NAME.get(name, name)} {installed(PIP_NAME.get(name, name))}"
        )


def test_pytorch_is_conda_forges_cuda_build():
    specs = dependencies(REPO / "envs/epochlens.yaml")
    assert specs["pytorch"]["build"] == "cuda*"
    assert "cuda-version" in specs
    assert "pytorch" not in dependencies(REPO / "envs/plots.yaml")


def rule_software() -> list[tuple[str, str, str]]:
    """(rule, environment file, script) of every rule that runs a script in a conda environment."""
    found = []
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=\s*rule\b)", smk.read_text()):
            name = re.search(r"rule\s*(\w*):(?:\s*name:\s*f?\"([^\"]+)\")?", block)
            conda = re.search(r"conda:\s*\"\.\./(envs/[\w.-]+)\"", block)
            script = re.search(r"script:\s*\"\.\./(scripts/[\w.-]+)\"", block)
            if conda and script:
                found.append((name[1] or name[2], conda[1], script[1]))
    return found


def third_party_imports(script: Path) -> set[str]:
    """Top-level names of the non-stdlib, non-epochlens modules that ``script`` and the epochlens
    modules it uses import (anywhere in the file, function-level imports included)."""
    names = set()
    for path in [script, *module_sources(script)]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    # _helpers and _no_pyarrow are the scripts' own modules (their imports are counted through
    # module_sources); snakemake reaches every script through the search path Snakemake's preamble
    # adds (the by-hand runner in _helpers uses it too), so no environment needs it.
    local = {"epochlens", "snakemake"} | {p.stem for p in (REPO / "scripts").glob("_*.py")}
    return {n for n in names if n not in sys.stdlib_module_names and n not in local}


def test_every_rule_gets_what_its_script_imports():
    rules = rule_software()
    assert len(rules) >= 20 and {env for _, env, _ in rules} == {"envs/epochlens.yaml", "envs/plots.yaml"}
    missing = {}
    for rule, env, script in rules:
        have = set(dependencies(REPO / env))
        lacks = {m for m in third_party_imports(REPO / script) if CONDA_NAME.get(m, m) not in have}
        if lacks:
            missing[rule] = (env, sorted(lacks))
    assert not missing, f"rules whose environment lacks what their script imports: {missing}"


def test_make_installs_the_pinned_versions():
    """envs/pip_constraints.py turns the pins into the pip constraints that `make` installs with:
    every pinned package but python, pytorch and conda-only ones, at the installed version."""
    import subprocess

    out = subprocess.run(
        [sys.executable, str(REPO / "envs" / "pip_constraints.py"), *map(str, ENV_FILES)],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    pinned = {PIP_NAME.get(name, name) for f in ENV_FILES for name in dependencies(f)}
    assert sorted(c.split("==")[0] for c in out) == sorted(pinned - {"python", "torch", *CONDA_ONLY})
    for constraint in out:
        name, version = constraint.split("==")
        assert installed(name) == version, constraint
