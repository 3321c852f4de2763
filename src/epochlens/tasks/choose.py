"""The run's task from its config (:func:`task_from_config`): a built-in by name, a user's Task
or loss function by import path (:func:`import_object`).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from epochlens.errors import ConfigError
from epochlens.tasks.base import Task
from epochlens.tasks.classification import ClassificationTask
from epochlens.tasks.language import LanguageModelTask, TextToTextTask
from epochlens.tasks.regression import RegressionTask
from epochlens.tasks.user import LossFunctionTask

BUILTIN_TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "regression": RegressionTask,
    "language_model": LanguageModelTask,
    "text_to_text": TextToTextTask,
}


def import_object(spec: str, search_path: str | None = None, what: str = "task") -> Any:
    """The object named ``"package.module:attribute"`` (``search_path`` put first on ``sys.path``).

    Raises:
        ConfigError: a malformed spec, a module that cannot be imported, or a missing attribute.
    """
    if ":" not in spec:
        raise ConfigError(f"{what} {spec!r}: give an import path 'package.module:name'")
    module_name, _, attr = spec.partition(":")
    if search_path and search_path not in sys.path:
        sys.path.insert(0, str(search_path))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"{what} {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc}). Check the "
            "spelling, and that its folder is on the import path (the config's path)."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def task_from_config(
    spec: str | Mapping | Task | None = None, active_classes: np.ndarray | list[int] | None = None
) -> Task:
    """A :class:`Task` from a run's config.

    Args:
        spec: None or ``"classification"`` (the default), ``"regression"``, ``"language_model"``, an
            import path ``"package.module:name"`` of a Task subclass, a Task instance or a per-sample
            loss function, or a mapping ``{"name": ..., "output": ..., "path": ..., **arguments}``:
            ``path`` is put on the import path; the other keys are the task class's arguments (a
            ``kwargs`` mapping is merged into them), or for a loss function ``sample`` and
            ``measurement`` (import paths too) and ``kwargs`` (the function's keyword arguments).
            A Task instance is returned as is.
        active_classes: the classes of a classification task (None: all).

    Raises:
        ConfigError: an unknown name, an import that fails, or arguments the task does not take.
    """
    if isinstance(spec, Task):
        return spec
    name, kwargs, path = _parse_spec(spec)
    if name == "classification":
        kwargs.setdefault("active_classes", active_classes)
    if name in BUILTIN_TASKS:
        kwargs = {**kwargs, **kwargs.pop("kwargs", {})}
        return _construct(BUILTIN_TASKS[name], kwargs, name)
    if ":" not in name:
        raise ConfigError(
            f"task: {name!r} is not one of {sorted(BUILTIN_TASKS)} nor an import path 'package.module:name'"
        )
    return _imported_task(name, kwargs, path)


def _parse_spec(spec: str | Mapping | None) -> tuple[str, dict, str | None]:
    """(name, arguments, path) of a task spec that is not a Task instance."""
    kwargs: dict = {}
    path = None
    if spec is None:
        name = "classification"
    elif isinstance(spec, str):
        name = spec
    elif isinstance(spec, Mapping):
        kwargs = dict(spec)
        name = kwargs.pop("name", kwargs.pop("kind", "classification"))
        path = kwargs.pop("path", None)
    else:
        raise ConfigError(f"task: {spec!r} is not a task name, an import path or a mapping")
    return name, kwargs, path


def _imported_task(name: str, kwargs: dict, path: str | None) -> Task:
    """The task of import path ``name``: a Task instance, a Task class or a per-sample loss function."""
    obj = import_object(name, path)
    if isinstance(obj, Task):
        if kwargs:
            raise ConfigError(f"task {name!r} is an instance; it takes no arguments (got {sorted(kwargs)})")
        return obj
    if inspect.isclass(obj):
        if not issubclass(obj, Task):
            raise ConfigError(
                f"task {name!r} is a class that does not derive from epochlens.tasks.Task; derive from it "
                "(override loss, and sample_targets for the true Fisher)."
            )
        kwargs = {**kwargs, **kwargs.pop("kwargs", {})}
        return _construct(obj, kwargs, name)
    if callable(obj):
        for k in ("sample", "measurement"):
            if isinstance(kwargs.get(k), str):
                kwargs[k] = import_object(kwargs[k], path, what=f"task {k}")
        kwargs.setdefault("name", name)
        return _construct(LossFunctionTask, {"fn": obj, **kwargs}, name)
    raise ConfigError(f"task {name!r} is a {type(obj).__name__}, not a Task, a Task class or a loss function")


def _construct(cls: type, kwargs: dict, name: str) -> Any:
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"task {name!r}: {exc}. Fix the task's arguments in the config.") from exc
