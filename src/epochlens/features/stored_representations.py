"""Representations of stored activations: a batch of one layer's activations (B, *shape) -> (B, d).

Built-ins (:data:`epochlens.features.stored_settings.STORED_BUILTINS`), each one line on a float32
tensor; a (B, D) activation counts as one token (B, 1, D) for the token reductions:

* ``pooled``, ``stats``, ``spectral``: the image features' own functions
  (:mod:`epochlens.features.representations`, channels first: (B, C, *positions)), so a stored
  activation gives the values that ``features_epoch`` computes from the model's hooks;
* ``mean``, ``max``, ``first`` (a CLS token), ``last``: over axis 1, the tokens of (B, T, D);
* ``norms``: the Euclidean norm of each token (B, T); ``flat``: the activation flattened.

A user's representation is a function named ``package.module:function`` (imported with
:func:`epochlens.formats.factory.import_factory`, ``project_path`` first on ``sys.path``) that takes
a float32 tensor (B, *shape) and returns a tensor or array (B, d), d the same for every batch.
:func:`checked` refuses anything else, and non-finite values, naming the layer, the representation
and the file.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from epochlens.errors import FeatureError
from epochlens.features import representations as reps
from epochlens.features.stored_settings import StoredFeatureSettings, is_user_representation
from epochlens.features.workspace import Workspace
from epochlens.formats.factory import FactorySpec, import_factory

Representation = Callable[[torch.Tensor], torch.Tensor | np.ndarray]


def _tokens(act: torch.Tensor) -> torch.Tensor:
    """(B, D) -> (B, 1, D); (B, T, D) as is; (B, T, *rest) -> (B, T, prod(rest))."""
    return act.unsqueeze(1) if act.ndim == 2 else act.flatten(2)


TOKEN_BUILTINS: dict[str, Representation] = {
    "mean": lambda a: _tokens(a).mean(1),
    "max": lambda a: _tokens(a).amax(1),
    "first": lambda a: _tokens(a)[:, 0],
    "last": lambda a: _tokens(a)[:, -1],
    "norms": lambda a: torch.linalg.vector_norm(_tokens(a), dim=2),
    "flat": lambda a: a.flatten(1),
}


def _image_builtin(name: str, settings: StoredFeatureSettings) -> Representation:
    spectral = settings.spectral_settings()
    image = reps.RepresentationSettings(
        names=(name,),
        spectral_k=spectral.spectral_k,
        spectral_method=spectral.spectral_method,
    )
    workspace = Workspace()
    return lambda a: reps.compute(a, image, deferred=False, workspace=workspace)[name]


def resolve(name: str, settings: StoredFeatureSettings) -> Representation:
    """The function of a representation name: a built-in, or the user's (imported now)."""
    if name in TOKEN_BUILTINS:
        return TOKEN_BUILTINS[name]
    if name in ("pooled", "stats", "spectral"):
        return _image_builtin(name, settings)
    if not is_user_representation(name):
        raise FeatureError(f"unknown representation {name!r}; fix features.representations.")
    return import_factory(FactorySpec(factory=name, project_path=settings.project_path))


def checked(value: object, batch: int, width: int | None, layer: str, name: str, path: object) -> np.ndarray:
    """``value`` as float32 (batch, d), or a FeatureError naming layer, representation and file:
    not an array, another shape, another d than the layer's earlier batches, or non-finite."""
    where = f"{path}: layer {layer!r}, representation {name!r}"
    if isinstance(value, torch.Tensor):
        value = value.detach().float().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise FeatureError(f"{where} returned a {type(value).__name__}, not a tensor or array (B, d).")
    if value.ndim != 2 or value.shape[0] != batch:
        raise FeatureError(
            f"{where} returned shape {tuple(value.shape)} for a batch of {batch}: a representation "
            f"returns ({batch}, d). Fix the function (flatten or reduce its output)."
        )
    if width is not None and value.shape[1] != width:
        raise FeatureError(f"{where} returned {value.shape[1]} columns, {width} for earlier rows.")
    finite = np.isfinite(value)
    if not finite.all():
        rows = np.flatnonzero(~finite.all(1))[:10].tolist()
        raise FeatureError(
            f"{where} gives non-finite values (NaN or Inf) in rows {rows} of a batch: check the "
            "stored activations and the function; nothing was written."
        )
    return value.astype(np.float32, copy=False)
