"""The user's model: building it from its factory, its logits, and its default blocks.

* :func:`build_user_model` calls the factory of a :class:`~epochlens.formats.factory.FactorySpec`
  and checks that it returns an ``nn.Module``.
* :func:`extract_logits` and :func:`attach_output_adapter` (from :mod:`epochlens.models.outputs`)
  take the logits out of whatever the forward returns.
* :func:`default_blocks` names the residual blocks / encoder layers that features, ablation and
  influence use when the config names none.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from epochlens.formats.factory import FactoryError, FactorySpec, import_factory
from epochlens.models.layers import BlockError, default_blocks
from epochlens.models.outputs import OutputError, attach_output_adapter, extract_logits

__all__ = [
    "BlockError",
    "OutputError",
    "attach_output_adapter",
    "build_user_model",
    "default_blocks",
    "extract_logits",
]


def build_user_model(spec: FactorySpec, defaults: Mapping[str, Any] | None = None) -> nn.Module:
    """Call the factory with ``spec.kwargs`` and return the ``nn.Module`` it builds.

    Args:
        spec: the factory and its keyword arguments.
        defaults: values the pipeline knows (e.g. ``num_classes``, ``in_channels``), passed only for
            parameters the factory accepts (by name or through ``**kwargs``) and ``model.kwargs`` does
            not set.

    Raises:
        FactoryError: import failures (see :func:`import_factory`), kwargs that do not fit the
            factory's signature, an exception inside the factory, or a result that is no ``nn.Module``.
    """
    fn = import_factory(spec)
    kwargs = dict(spec.kwargs)
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C extensions have none
        signature = None
    if signature is not None:
        params = signature.parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for name, value in (defaults or {}).items():
            if name not in kwargs and (name in params or var_kw):
                kwargs[name] = value
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise FactoryError(
                f"model.kwargs {spec.kwargs} do not fit {spec.factory}{signature} ({exc}); fix "
                "model.kwargs in the config."
            ) from exc
    try:
        model = fn(**kwargs)
    except Exception as exc:
        raise FactoryError(
            f"model.factory={spec.factory!r} raised {type(exc).__name__}: {str(exc)[:300]} when called "
            f"with {kwargs}; fix model.kwargs or the factory."
        ) from exc
    if not isinstance(model, nn.Module):
        hint = ""
        if isinstance(model, (tuple, list)) and any(isinstance(m, nn.Module) for m in model):
            hint = " (it returned a sequence holding a module: return the module itself)"
        raise FactoryError(
            f"model.factory={spec.factory!r} returned a {type(model).__name__}, not a torch.nn.Module"
            f"{hint}. Point model.factory at a function that returns the network."
        )
    return model
