"""Print pip constraints (``name==version``) from the conda environment files given, so that
``make`` installs the versions the tests ran with (the same pins as ``snakemake --sdm conda``).

    python envs/pip_constraints.py envs/*.yaml >> .venv/constraints.txt

Standard library only (it runs before anything is installed). Skipped: python and conda-only
packages, and pytorch (the torch already in the environment is kept: a CPU wheel, or your CUDA
build). Conda names are mapped to pip's where they differ.
"""

from __future__ import annotations

import re
import sys

PIP_NAME = {"matplotlib-base": "matplotlib", "pyyaml": "PyYAML"}
SKIP = {"python", "pytorch", "cuda-version"}
PIN = re.compile(r"^\s*-\s*([A-Za-z0-9_.-]+)\s*=\s*([0-9][^=\s]*)\s*(?:=\S+)?\s*(?:#.*)?$")


def constraints(paths: list[str]) -> list[str]:
    pins: dict[str, str] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                m = PIN.match(line)
                if not m or m[1].lower() in SKIP:
                    continue
                name, version = PIP_NAME.get(m[1].lower(), m[1]), m[2]
                if pins.setdefault(name, version) != version:
                    sys.exit(f"{path}: {name}={version}, but another file pins {name}={pins[name]}")
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


if __name__ == "__main__":
    print("\n".join(constraints(sys.argv[1:])))
