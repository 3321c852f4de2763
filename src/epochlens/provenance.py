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
    """The files whose edits change what ``script`` computes: the ``epochlens`` modules it imports,
    directly or through other modules, and the helper modules next to it (``scripts/_helpers.py``).

    Snakemake does not notice edits to modules a script imports; listing these files as a rule's
    inputs makes a change to any of them rebuild what the rule produced (the import graph is the
    rerun graph). Rules:

    * ``from epochlens.a.b import x``: module ``a/b.py`` (or package ``a/b/__init__.py``), the
      ``__init__.py`` of its parent packages (Python runs them), and what all of these import;
      ``x`` counts as well when it is a submodule.
    * A name a package exports lazily (its ``_EXPORTS``, :mod:`epochlens._lazy`) counts as the
      module that defines it; any other name of such a package (or ``import epochlens.a``, whose
      attributes cannot be known) counts as the whole package, every ``.py`` file in it.
    * The top-level ``epochlens/__init__.py`` is left out (it only holds the version).
    """
    found: set[Path] = set()
    todo = [Path(script).resolve()]
    while todo:
        for path in _direct_imports(todo.pop(), package_dir.resolve()):
            if path not in found:
                found.add(path)
                todo.append(path)
    return sorted(found)


def _module_file(package_dir: Path, parts: list[str]) -> Path | None:
    """The file of module ``epochlens.<parts>`` (module or package), or None."""
    base = package_dir.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def _lazy_exports(init: Path) -> dict[str, str] | None:
    """The ``_EXPORTS`` dict literal of a package's ``__init__.py`` (None when it has none)."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def _whole_package(init: Path) -> list[Path]:
    return sorted(init.parent.rglob("*.py"))


def _resolve(package_dir: Path, module: str, names: list[str] | None) -> list[Path]:
    """Files that importing ``names`` from ``module`` (``None``: the module itself) loads."""
    parts = module.split(".")[1:]
    paths = [p for k in range(1, len(parts) + 1) if (p := _module_file(package_dir, parts[:k]))]
    if not paths or paths[-1] != _module_file(package_dir, parts):
        return paths  # not an epochlens module
    target = paths[-1]
    lazy = _lazy_exports(target) if target.name == "__init__.py" else None
    if lazy is not None and names is None:
        return paths + _whole_package(target)
    for name in names or []:
        sub = _module_file(package_dir, [*parts, name])
        if sub is not None:
            paths.append(sub)
        elif lazy is not None and name in lazy:
            from epochlens._lazy import module_of

            paths += _resolve(package_dir, module_of(module, lazy[name]), None)
        elif lazy is not None:  # a name the package does not export: be safe
            paths += _whole_package(target)
    return paths


def _direct_imports(source: Path, package_dir: Path) -> tuple[Path, ...]:
    """The files that ``source`` imports itself (see :func:`module_sources`)."""
    stat = source.stat()
    return _parsed_imports(source, package_dir, stat.st_mtime_ns, stat.st_size)


@cache
def _parsed_imports(source: Path, package_dir: Path, mtime_ns: int, size: int) -> tuple[Path, ...]:
    """Cached per file version: the workflow asks for the modules of every rule's script, which
    share most of their imports (parsing each file once keeps a dry run of a large study fast)."""
    tree = ast.parse(source.read_text())
    paths: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level and source.is_relative_to(package_dir):  # relative, inside the library
                pkg = list(source.parent.relative_to(package_dir.parent).parts)  # its package
                base = pkg[: len(pkg) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            imports = [(module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in imports:
            top = module.split(".")[0]
            if top == "epochlens":
                if module == "epochlens":  # from epochlens import config, ...
                    for name in names or []:
                        paths += _resolve(package_dir, f"epochlens.{name}", None)
                else:
                    paths += _resolve(package_dir, module, names)
            elif not source.is_relative_to(package_dir) and (helper := source.parent / f"{top}.py").is_file():
                paths.append(helper.resolve())  # a script's helper module next to it
    return tuple(dict.fromkeys(p.resolve() for p in paths))


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
