"""The library's import graph, read from the AST (nothing is imported): no loops, and no import that
runs back up between the stage packages. The import graph is the rerun graph (a rule's inputs are the
modules its script imports), so a loop or an upward import makes an edit rerun another stage's jobs.

Run as a script, it prints the counts the house rules watch (loops, upward imports, modules past 500
lines, functions past 80 lines) for a checkout::

    python tests/unit/core/test_import_graph.py [REPO]
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: The floor of each package of ``src/epochlens``: a package imports only packages of lower floors
#: (modules at the top level, ``epochlens/*.py``, are not ranked). The stages sit side by side and do
#: not import each other; studies use the engines, engines know nothing of studies; models do not
#: read the user's formats; the config checks and the per-sample dossier see everything.
FLOORS = {
    "tasks": 0,  # the run's loss, per task family
    "data": 1,
    "models": 2,
    "formats": 3,  # the user's models, weights, images, tables, training commands
    "curvature": 4,
    "features": 4,
    "probes": 4,
    "ablation": 4,
    "influence": 4,
    "plotting": 4,
    "study": 5,  # the data-quality studies: poison detection, LDS
    "config": 6,
    "samples": 6,
    "explorer": 7,
}
MODULE_LINES = 500
FUNCTION_LINES = 80


def module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(src: Path) -> dict[str, Path]:
    return {module_name(src, p): p for p in sorted(src.rglob("*.py"))}


@cache
def _exports(init: Path) -> dict[str, str]:
    """A package's lazy names (its ``_EXPORTS`` literal, :mod:`epochlens._lazy`): name -> module."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def imported_names(path: Path, name: str) -> set[str]:
    """Dotted names that ``path`` (module ``name``) imports anywhere in its body: ``import a.b`` gives
    ``a.b``; ``from a import b`` gives ``a`` and ``a.b``; relative imports are made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {n for n in out if n == "epochlens" or n.startswith("epochlens.")}


def import_graph(src: Path) -> dict[str, set[str]]:
    """module -> the library modules it makes Python run: the module a name resolves to (a lazily
    exported name resolves to the module that defines it), and the ``__init__`` of the packages
    above it that the importer is not already inside."""
    mods = modules(src)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for dotted in imported_names(path, m):
            target = dotted
            while target not in mods and "." in target:
                package, _, attr = target.rpartition(".")
                if package in mods and attr in _exports(mods[package]):
                    lazy = _exports(mods[package])[attr]
                    target = lazy if lazy.startswith("epochlens.") else f"{package}.{lazy}"
                    break
                target = package
            if target not in mods or target == "epochlens":
                continue
            parts = target.split(".")
            for k in range(2, len(parts) + 1):
                above = ".".join(parts[:k])
                if above != m and not m.startswith(above + "."):
                    graph[m].add(above)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def package_of(module: str, packages: set[str]) -> str | None:
    """The package of ``src/epochlens`` a module belongs to (None: a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in packages else None


def upward_imports(src: Path, graph: dict[str, set[str]]) -> list[str]:
    """``a.x -> b.y`` for every import of a package by one on the same or a lower floor."""
    packages = {p.parent.name for p in src.glob("*/__init__.py")}
    out = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            a, b = package_of(m, packages), package_of(t, packages)
            if a is None or b is None or a == b:
                continue
            if FLOORS[b] >= FLOORS[a]:
                out.append(f"{m} -> {t} ({a} floor {FLOORS[a]}, {b} floor {FLOORS[b]})")
    return out


def long_modules(root: Path) -> list[str]:
    out = []
    for folder in ("src", "scripts", "benchmarks"):
        for p in sorted((root / folder).rglob("*.py")):
            n = len(p.read_text().splitlines())
            if n > MODULE_LINES:
                out.append(f"{p.relative_to(root)} {n}")
    return out


def long_functions(root: Path) -> list[str]:
    """Functions of src/ past 80 lines, counted as /work/shared/hooks/long_functions.py does."""
    out = []
    for p in sorted((root / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    out.append(f"{p.relative_to(root)}:{node.lineno} {node.name} {n}")
    return out


# ------------------------------------------------------------------ the tests
SRC = ROOT / "src" / "epochlens"


def test_every_package_has_a_floor():
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    assert packages <= set(FLOORS), (
        f"packages {sorted(packages - set(FLOORS))} have no floor: add them to FLOORS in {__file__} "
        "(below every package they are imported by, above every package they import)"
    )


def test_the_library_has_no_import_loop():
    assert loops(import_graph(SRC)) == []


def test_no_package_imports_one_of_its_floor_or_above():
    assert upward_imports(SRC, import_graph(SRC)) == []


def test_the_checks_see_loops_and_upward_imports(tmp_path):
    """The checks fail where they should: a loop of two modules, a lazily exported name that closes a
    loop, a package __init__ that closes one, and a model importing the user's formats."""
    src = tmp_path / "epochlens"
    files = {
        "__init__.py": "",
        "a.py": "from epochlens import b\n",
        "b.py": "def f():\n    from epochlens.a import g\n",
        "models/__init__.py": "_EXPORTS = {'build_it': 'build'}\n",
        "models/build.py": "from epochlens.formats.user import adapt\n",
        "formats/__init__.py": "from epochlens.formats.user import adapt\n",
        "formats/user.py": "from epochlens.models import build_it\nfrom ..c import x\n",
        "c.py": "import epochlens.formats.other\n",
        "formats/other.py": "",
    }
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    graph = import_graph(src)
    assert graph["epochlens.models"] == set()  # a lazy __init__ imports nothing
    assert "epochlens.models.build" in graph["epochlens.formats.user"]  # the name's own module
    assert loops(graph) == [
        ["epochlens.a", "epochlens.b"],
        ["epochlens.c", "epochlens.formats", "epochlens.formats.user", "epochlens.models.build"],
    ]
    assert upward_imports(src, graph) == [
        "epochlens.models.build -> epochlens.formats (models floor 2, formats floor 3)",
        "epochlens.models.build -> epochlens.formats.user (models floor 2, formats floor 3)",
    ]


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    src = root / "src" / "epochlens"
    graph = import_graph(src)
    for title, rows in (
        ("import loops", [" <-> ".join(c) for c in loops(graph)]),
        ("upward imports between packages", upward_imports(src, graph)),
        (f"modules past {MODULE_LINES} lines (src, scripts, benchmarks)", long_modules(root)),
        (f"functions past {FUNCTION_LINES} lines (src)", long_functions(root)),
    ):
        print(f"{title}: {len(rows)}")
        print("".join(f"  {r}\n" for r in rows), end="")
