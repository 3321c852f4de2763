"""Lazy public names of a package (PEP 562), so that importing a package never imports torch.

A stage package's ``__init__.py`` names its public API in a literal dict ``_EXPORTS`` (name ->
module that defines it: a submodule name, or an absolute ``epochlens.*`` module) and calls
:func:`attach`. ``from epochlens.curvature import per_sample_curvature`` then imports
``epochlens.curvature.estimator`` on first use, while ``import epochlens.curvature.settings`` (what
the workflow does while planning) imports nothing heavy. :func:`epochlens.provenance.module_sources`
reads the same dict to know which module a name comes from.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def module_of(package: str, target: str) -> str:
    """Absolute module name of an ``_EXPORTS`` value of ``package``."""
    return target if target.startswith("epochlens.") else f"{package}.{target}"


def attach(package: str, exports: dict[str, str]) -> tuple[Callable, Callable, list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` exporting ``exports`` lazily."""

    def __getattr__(name: str):
        try:
            target = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module_of(package, target)), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(exports))

    return __getattr__, __dir__, sorted(exports)
