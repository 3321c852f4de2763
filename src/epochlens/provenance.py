"""What produced a result: code version, the library modules a script uses, package versions."""

from __future__ import annotations

import ast
import hashlib
import json
import platform
import subprocess
from collections.abc import Sequence
from functools import cache
from importlib import metadata
from pathlib import Path

import epochlens

PACKAGE_DIR = Path(epochlens.__file__).resolve().parent
_PACKAGES = ("torch", "numpy", "h5py", "pandas", "scikit-learn", "matplotlib", "snakemake")


def module_sources(script: str | Path, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The ``epochlens`` modules that ``script`` imports, directly or through other modules.

    Snakemake does not notice edits to modules a script imports; listing these files as a rule's
    inputs makes a change to any of them rebuild what the rule produced. A subpackage counts as its
    ``__init__.py`` and what that imports; the top-level ``__init__.py`` is left out (it only holds
    the version).
    """
    found: set[Path] = set()
    todo = [Path(script)]
    while todo:
        for path in _direct_imports(todo.pop(), package_dir):
            if path not in found:
                found.add(path)
                todo.append(path)
    return sorted(found)


@cache
def _direct_imports(source: Path, package_dir: Path) -> tuple[Path, ...]:
    """The ``epochlens`` modules that the file ``source`` imports itself. Cached: the workflow asks
    for the modules of every rule's script, which share most of their imports (parsing each file
    once keeps a dry run of a large study fast)."""
    tree = ast.parse(source.read_text())
    paths = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "epochlens" or len(parts) < 2:
                continue
            module = package_dir.joinpath(*parts[1:])
            for path in (module.with_suffix(".py"), module / "__init__.py"):  # module or subpackage
                if path.is_file():
                    paths.append(path)
    return tuple(dict.fromkeys(paths))


@cache
def code_version() -> dict:
    """Git commit and dirty flag of the checkout holding the library (or the package version)."""
    info = {"epochlens": epochlens.__version__, "git_commit": None, "git_dirty": None}
    try:
        root = PACKAGE_DIR.parents[1]
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            info["git_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def config_hash(cfg: dict) -> str:
    """SHA-256 of a config section, independent of key order."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def provenance(
    cfg: dict, inputs: dict[str, str] | None = None, device: str | None = None, dtype: str | None = None
) -> dict:
    """Provenance record for a metadata.json: code, config hash, input hashes, packages, device."""
    record = {
        "code": code_version(),
        "config_hash": config_hash(cfg),
        "inputs": inputs or {},
        "packages": package_versions(),
    }
    if device is not None:
        record["device"] = device
    if dtype is not None:
        record["dtype"] = dtype
    return record


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks of ``chunk`` bytes (1 MiB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_digests(paths: Sequence[str | Path]) -> dict[str, str]:
    """{path: "sha256:<hex>"} of input files (:func:`file_sha256`)."""
    return {str(path): "sha256:" + file_sha256(path) for path in paths}


def table_provenance(cfg: dict, inputs: Sequence[str | Path], tables: Sequence[str | Path]) -> dict:
    """Provenance of tables made from ``inputs``: written next to them as ``*.provenance.json``."""
    return {"tables": [str(t) for t in tables], **provenance(cfg, file_digests(inputs))}
