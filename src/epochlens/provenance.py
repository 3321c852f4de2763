"""What produced a result: code version, the library modules a script uses, package versions."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from functools import cache
from importlib import metadata
from pathlib import Path

import epochlens

PACKAGE_DIR = Path(epochlens.__file__).resolve().parent
_PACKAGES = ("torch", "numpy", "h5py", "pandas", "scikit-learn", "matplotlib", "snakemake")


def module_sources(script: str | Path, package_dir: Path = PACKAGE_DIR, cache: bool = True) -> list[Path]:
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

    With ``cache``, the answer is kept in ``<package>/__pycache__/module_sources.json`` for as long
    as no ``.py`` file of the package or of the script's folder changes (path, size, mtime): a dry
    run of the workflow then parses no file (parsing them all is most of a second).
    """
    script = Path(script).resolve()
    package_dir = package_dir.resolve()
    fingerprint = _fingerprint(package_dir, script.parent)
    if _SEEN.setdefault((package_dir, script.parent), fingerprint) != fingerprint:
        # A module changed, appeared or went: what a file's imports resolve to may have changed.
        _parsed_imports.cache_clear()
        _lazy_exports.cache_clear()
        _SEEN[package_dir, script.parent] = fingerprint
    if cache:
        return _SourcesCache.of(package_dir, script.parent, fingerprint).sources(script)
    return _module_sources(script, package_dir)


#: The fingerprint (:func:`_fingerprint`) of each (package, script folder) at its last use.
_SEEN: dict[tuple[Path, Path], str] = {}


def _module_sources(script: Path, package_dir: Path) -> list[Path]:
    found: set[Path] = set()
    todo = [script]
    while todo:
        for path in _direct_imports(todo.pop(), package_dir):
            if path not in found:
                found.add(path)
                todo.append(path)
    return sorted(found)


class _SourcesCache:
    """:func:`module_sources` of the scripts of one folder, kept in memory and on disk for one
    fingerprint of the package's and the folder's ``.py`` files (path, size, mtime)."""

    _open: dict[tuple[Path, Path], _SourcesCache] = {}

    def __init__(self, package_dir: Path, script_dir: Path, fingerprint: str) -> None:
        self.package_dir, self.script_dir, self.fingerprint = package_dir, script_dir, fingerprint
        self.file = package_dir / "__pycache__" / "module_sources.json"
        entry = self._stored().get(str(script_dir))
        valid = isinstance(entry, dict) and entry.get("fingerprint") == fingerprint
        self.known: dict[str, list[str]] = entry["sources"] if valid else {}

    @classmethod
    def of(cls, package_dir: Path, script_dir: Path, fingerprint: str) -> _SourcesCache:
        """The cache of the files as they are now (``fingerprint``: :func:`_fingerprint`)."""
        cached = cls._open.get((package_dir, script_dir))
        if cached is None or cached.fingerprint != fingerprint:
            cached = cls._open[(package_dir, script_dir)] = cls(package_dir, script_dir, fingerprint)
        return cached

    def sources(self, script: Path) -> list[Path]:
        if str(script) not in self.known:
            self.known[str(script)] = [str(p) for p in _module_sources(script, self.package_dir)]
            self._save()
        return [Path(p) for p in self.known[str(script)]]

    def _stored(self) -> dict:
        try:
            stored = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}
        return stored if isinstance(stored, dict) else {}

    def _save(self) -> None:
        """Write the file atomically; a folder that cannot be written (an installed package) only
        means the next process parses again."""
        stored = self._stored()
        stored[str(self.script_dir)] = {"fingerprint": self.fingerprint, "sources": self.known}
        tmp = self.file.with_name(f"{self.file.name}.{os.getpid()}.tmp")
        try:
            self.file.parent.mkdir(exist_ok=True)
            tmp.write_text(json.dumps(stored))
            os.replace(tmp, self.file)
        except OSError:
            pass


def _fingerprint(package_dir: Path, script_dir: Path) -> str:
    """Path, size and mtime of every ``.py`` file of the package (recursively) and of the script's
    folder: any edit, new or removed module changes it (a folder walk, about a millisecond)."""
    stats = []
    for root, dirs, names in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        stats += [(root, n) for n in names if n.endswith(".py")]
    stats += [(str(script_dir), n) for n in os.listdir(script_dir) if n.endswith(".py")]
    stamped = sorted(
        (root, n, (st := os.stat(os.path.join(root, n))).st_size, st.st_mtime_ns) for root, n in stats
    )
    return hashlib.sha256(repr(stamped).encode()).hexdigest()


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
