"""The user's model factory: ``model.factory: "package.module:function"``. Torch-free.

A factory is any callable in the user's code that returns the ``nn.Module`` whose checkpoints are
analysed, configured as::

    model:
      factory: "tinyvit.model:build"      # package.module:function (or :Class, :Class.method)
      kwargs: {dim: 16, depth: 2}         # passed to the factory
      project_path: /home/me/tinyvit-repo # put first on sys.path, so `import tinyvit` works
      output: logits                      # optional: where the logits are in the forward's output

:func:`factory_sources` lists the project's source files the factory's module imports, by reading
them (an AST walk, never importing the user's code), so the workflow can make them rule inputs and
hash them into provenance: editing the user's model reruns the jobs that use it, and only those.
:func:`import_factory` imports the factory itself (this runs the user's code).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochlens.errors import EpochlensError

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_FACTORY_RE = re.compile(rf"^({_IDENT}(?:\.{_IDENT})*):({_IDENT}(?:\.{_IDENT})*)$")
_FIX_PATH = (
    "Set model.project_path to the folder that holds the package (the repository root, or its src/ "
    "for a src layout), or install the package into this environment"
)


class FactoryError(EpochlensError):
    """A model factory that cannot be found, imported or called, or that returns no ``nn.Module``."""


@dataclass
class FactorySpec:
    """Where the user's model comes from (the ``model`` section of a config with ``factory``)."""

    factory: str = field(
        metadata={"help": '"package.module:function" returning the nn.Module (":Class" works too)'}
    )
    kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "keyword arguments passed to the factory"}
    )
    project_path: Path | None = field(
        default=None,
        metadata={
            "help": "folder put first on sys.path so the user's package imports (the repository "
            "root or its src/); its files the factory imports are tracked as inputs. None: the "
            "package must be installed, and its files are not tracked"
        },
    )
    output: str | None = field(
        default=None,
        metadata={
            "help": "name of the logits in the forward's output (dict key or attribute); None: a "
            "tensor as is, else .logits / ['logits'] / the first element of a tuple"
        },
    )

    def __post_init__(self) -> None:
        if not isinstance(self.factory, str) or not _FACTORY_RE.match(self.factory.strip()):
            raise FactoryError(
                f"model.factory={self.factory!r} is not of the form 'package.module:function' "
                "(e.g. 'tinyvit.model:build'); fix model.factory in the config."
            )
        self.factory = self.factory.strip()
        if self.kwargs is None:
            self.kwargs = {}
        if not isinstance(self.kwargs, Mapping):
            raise FactoryError(
                f"model.kwargs must be a mapping of keyword arguments for {self.factory}, got "
                f"{type(self.kwargs).__name__}; fix model.kwargs in the config."
            )
        self.kwargs = dict(self.kwargs)
        if self.project_path is not None:
            self.project_path = Path(self.project_path).expanduser()
        if self.output is not None and (not isinstance(self.output, str) or not self.output):
            raise FactoryError(f"model.output={self.output!r} must be a non-empty name or null.")

    @classmethod
    def from_config(cls, model: Mapping[str, Any]) -> FactorySpec:
        """The spec of a config's ``model`` section (keys factory, kwargs, project_path, output)."""
        if "factory" not in model:
            raise FactoryError(
                "the model section has no 'factory'; set model.factory: 'package.module:function'."
            )
        return cls(
            factory=model["factory"],
            kwargs=model.get("kwargs") or {},
            project_path=model.get("project_path"),
            output=model.get("output"),
        )

    @property
    def module_name(self) -> str:
        """``package.module`` of ``package.module:function``."""
        return self.factory.split(":")[0]

    @property
    def attribute(self) -> str:
        """``function`` of ``package.module:function`` (may be dotted: ``Class.method``)."""
        return self.factory.split(":")[1]


# ---------------------------------------------------------------------------------------------
# Source files (torch-free, nothing imported)


def factory_sources(spec: FactorySpec) -> list[Path]:
    """The user's source files that the factory's module imports, directly or indirectly.

    Reads ``project_path``: the module's file, the ``__init__.py`` of the packages that contain it,
    and every file under ``project_path`` reached by its ``import`` / ``from ... import`` statements
    (absolute and relative), recursively. Imports of anything outside the project (torch, installed
    packages) are not followed. Dynamic imports (``importlib.import_module("x")``) are not seen.

    Returns:
        Sorted absolute paths; ``[]`` when ``project_path`` is None (an installed package,
        versioned by its release).

    Raises:
        FactoryError: the module is not under ``project_path`` or a file has a syntax error.
    """
    if spec.project_path is None:
        return []
    root = _project_root(spec)
    start = _module_files(spec.module_name, root)
    if start is None:
        raise FactoryError(_not_found_message(spec, spec.module_name, [root]))
    found: set[Path] = set(start)
    todo = list(start)
    while todo:
        path = todo.pop()
        stat = path.stat()
        for dep in _project_imports(path, root, stat.st_mtime_ns, stat.st_size):
            if dep not in found:
                found.add(dep)
                todo.append(dep)
    return sorted(found)


def factory_fingerprint(spec: FactorySpec) -> str:
    """SHA-256 of what the built model depends on: factory, kwargs, output and source contents.

    Source files enter with their path relative to ``project_path``, so moving the project keeps the
    fingerprint.
    """
    sources = {}
    for path in factory_sources(spec):
        sources[path.relative_to(_project_root(spec)).as_posix()] = hashlib.sha256(
            path.read_bytes()
        ).hexdigest()
    payload = {
        "factory": spec.factory,
        "kwargs": spec.kwargs,
        "output": spec.output,
        "sources": sources,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def check_trained_with(spec: FactorySpec, checkpoint: str | Path) -> None:
    """Refuse to build the model for ``checkpoint`` from sources other than those that trained it.

    A checkpoint that the user's command trained (``checkpoints.source: command``) has the
    training's ``train_metadata.json`` two folders up (``results/{run}/index-{i}/``): the SHA-256
    of every file the command used, relative to its git repository. A source of the factory among
    them whose content differs now (an uncommitted edit) would give this job a model that the
    checkpoint was not trained with, while the other stages keep the old one: FactoryError naming
    the files and the fixes. Checkpoints without that record (your own folder) pass.
    """
    record = Path(checkpoint).parent.parent / "train_metadata.json"
    if spec.project_path is None or not record.is_file():
        return
    meta = json.loads(record.read_text())
    root, trained = meta.get("git", {}).get("repository"), meta.get("provenance", {}).get("inputs", {})
    if not root:
        return
    changed = []
    for path in factory_sources(spec):
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else None
        if name in trained and hashlib.sha256(path.read_bytes()).hexdigest() != trained[name]:
            changed.append(name)
    if changed:
        raise FactoryError(
            f"model.factory {spec.factory!r}: {', '.join(changed)} in {root} changed since the "
            f"checkpoint {checkpoint} was trained ({record}); built from the edited code it would "
            "be analysed with a model it was not trained with. Commit the edit (snakemake then "
            f"trains again and reruns every stage), or undo it (git -C {root} diff shows it)."
        )


def _project_root(spec: FactorySpec) -> Path:
    assert spec.project_path is not None
    root = spec.project_path.resolve()
    if not root.is_dir():
        raise FactoryError(
            f"model.project_path={spec.project_path}: no such folder. Point it at the folder that "
            f"holds the package of {spec.factory!r}."
        )
    return root


def _module_files(name: str, root: Path) -> list[Path] | None:
    """Files Python runs to import ``name`` from ``root``: package ``__init__.py`` files and the
    module itself. None when ``name`` is not a module or package under ``root``."""
    parts = name.split(".")
    files = []
    for i in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:i])
        if (base / "__init__.py").is_file():
            files.append(base / "__init__.py")
        elif base.is_dir() and i < len(parts):  # namespace package
            continue
        elif base.with_suffix(".py").is_file() and i == len(parts):
            files.append(base.with_suffix(".py"))
        elif base.is_dir():  # namespace package as the module itself: nothing to run
            continue
        else:
            return None
    return files


def _package_of(path: Path, root: Path) -> list[str] | None:
    """The dotted package (as parts) that the file ``path`` belongs to, relative to ``root``."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return None
    return list(rel.parts[:-1])


_IMPORT_CACHE: dict[tuple[Path, Path, int, int], tuple[Path, ...]] = {}


def _project_imports(path: Path, root: Path, mtime_ns: int, size: int) -> tuple[Path, ...]:
    """Project files that ``path`` imports itself (cached by path, mtime and size: the DAG asks for
    the same files for every job, and an edited file is parsed again)."""
    key = (path, root, mtime_ns, size)
    if key in _IMPORT_CACHE:
        return _IMPORT_CACHE[key]
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        raise FactoryError(
            f"{path}:{exc.lineno}: syntax error in the model's source ({exc.msg}); fix the file."
        ) from exc
    package = _package_of(path, root)
    candidates: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            candidates += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module.split(".") if node.module else []
            else:
                if package is None or node.level - 1 > len(package):
                    continue
                base = package[: len(package) - (node.level - 1)]
                if node.module:
                    base = base + node.module.split(".")
            if base:
                candidates.append(".".join(base))
            candidates += [".".join([*base, alias.name]) for alias in node.names if alias.name != "*"]
    paths: list[Path] = []
    for name in candidates:
        paths += _module_files(name, root) or []
    result = tuple(dict.fromkeys(paths))
    _IMPORT_CACHE[key] = result
    return result


# ---------------------------------------------------------------------------------------------
# Import (runs the user's code)


def import_factory(spec: FactorySpec) -> Callable[..., Any]:
    """Import the factory's module (``project_path`` first on ``sys.path``) and return the callable.

    A package of the same top-level name imported earlier from another folder (e.g. a second
    project in the same process) is forgotten first, so the files under ``project_path`` are used.

    Raises:
        FactoryError: module not found (naming the folders searched), the module fails to import
            (naming the user's file and line), the attribute is missing (listing what the module
            has) or not callable.
    """
    searched: list[Path | str]
    if spec.project_path is not None:
        root = _project_root(spec)
        if str(root) in sys.path:
            sys.path.remove(str(root))
        sys.path.insert(0, str(root))
        _forget_shadowed(spec.module_name.split(".")[0], root)
        searched = [root]
    else:
        searched = ["sys.path: " + ", ".join(p or "." for p in sys.path[:4]) + ", ..."]
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(spec.module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (spec.module_name == missing or spec.module_name.startswith(missing + ".")):
            raise FactoryError(_not_found_message(spec, missing, searched)) from exc
        raise FactoryError(
            f"model.factory={spec.factory!r}: importing {spec.module_name} failed because it imports "
            f"{missing!r}, which is not installed ({_user_frame(exc)}). Install it into this "
            "environment (and add it to envs/epochlens.yaml)."
        ) from exc
    except SyntaxError as exc:
        raise FactoryError(
            f"{exc.filename}:{exc.lineno}: syntax error while importing {spec.module_name} for "
            f"model.factory={spec.factory!r} ({exc.msg}); fix the file."
        ) from exc
    except Exception as exc:
        raise FactoryError(
            f"model.factory={spec.factory!r}: importing {spec.module_name} raised "
            f"{type(exc).__name__}: {str(exc)[:300]} ({_user_frame(exc)}). Fix the module so that "
            f"'python -c \"import {spec.module_name}\"' works from {searched[0]}."
        ) from exc
    obj: Any = module
    for i, part in enumerate(spec.attribute.split(".")):
        if not hasattr(obj, part):
            owner = spec.module_name + "".join("." + p for p in spec.attribute.split(".")[:i])
            names = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))
            raise FactoryError(
                f"model.factory={spec.factory!r}: {owner} ({getattr(module, '__file__', '?')}) has no "
                f"attribute {part!r}. Callables it defines: {names[:30]}. Fix the name after ':' in "
                "model.factory."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(
            f"model.factory={spec.factory!r}: {spec.attribute} in {getattr(module, '__file__', '?')} is "
            f"a {type(obj).__name__}, not a callable. Name a function or class that returns the model."
        )
    return obj


def _forget_shadowed(top: str, root: Path) -> None:
    """Drop ``top`` and its submodules from ``sys.modules`` when ``root`` holds a package of that
    name but the imported one came from elsewhere (never touches packages the project lacks)."""
    if not ((root / top).is_dir() or (root / f"{top}.py").is_file()):
        return
    module = sys.modules.get(top)
    if module is None:
        return
    locations = [getattr(module, "__file__", None), *list(getattr(module, "__path__", []) or [])]
    if any(loc and Path(loc).resolve().is_relative_to(root) for loc in locations):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def _not_found_message(spec: FactorySpec, missing: str, searched: list) -> str:
    return (
        f"model.factory={spec.factory!r}: no module {missing!r} found (searched "
        f"{', '.join(str(s) for s in searched)}). {_FIX_PATH}; the module {spec.module_name} must be "
        f"the file {'/'.join(spec.module_name.split('.'))}.py (or a package folder with __init__.py) "
        "under it."
    )


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the innermost traceback frame outside the import machinery."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    if not frames:
        return "no traceback"
    f = frames[-1]
    return f"{f.filename}:{f.lineno}"
