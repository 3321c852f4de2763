"""Which modules influence tracks: a model's Linear, Conv2d and GPT-2 Conv1D modules chosen by name
patterns, tied weights as one layer (:func:`select_layers`). What a tracked layer is and its
per-sample inputs and output gradients: :mod:`epochlens.influence.layers`.
"""

from __future__ import annotations

import fnmatch

from torch import nn

from epochlens.errors import LayerSelectionError
from epochlens.influence.layers import SUPPORTED, LayerInfo, trackable


def _has_wildcard(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def select_layers(
    model: nn.Module, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()
) -> dict[str, LayerInfo]:
    """Tracked layers of ``model`` in module order, chosen by fnmatch patterns on their names.

    Args:
        model: the network.
        include: patterns (``"fc"``, ``"layer4.*"``); empty: every trackable module.
        exclude: patterns removed from the selection.

    Modules sharing one weight are one layer (named after the first; the others are its aliases);
    it is selected when any of them is and none is excluded.

    Raises:
        LayerSelectionError: a pattern matching no trackable module, a module named explicitly whose
            type cannot be tracked (the supported types are listed), an empty selection, a selected
            Conv2d that the unfold view cannot represent (groups > 1, non-zero padding mode), or
            modules sharing a weight but not their bias.
    """
    named = dict(model.named_modules())
    # nn.MultiheadAttention applies out_proj's weight with F.linear: the module never runs.
    inert = {f"{n}.out_proj" for n, m in named.items() if isinstance(m, nn.MultiheadAttention)}
    candidates = {n: m for n, m in named.items() if trackable(m) and n not in inert}
    if not candidates:
        raise LayerSelectionError(
            f"{type(model).__name__} has no module that influence can track ({SUPPORTED}); it needs at "
            "least one."
        )
    for pattern in include:
        _check_pattern(pattern, named, candidates, inert)
    groups: dict[int, list[str]] = {}
    for name, module in candidates.items():
        groups.setdefault(id(module.weight), []).append(name)
    owners = _parameter_owners(named)

    def selected(name: str) -> bool:
        return (not include or any(fnmatch.fnmatchcase(name, p) for p in include)) and not any(
            fnmatch.fnmatchcase(name, p) for p in exclude
        )

    chosen = {}
    done: set[int] = set()
    for name, module in candidates.items():
        key = id(module.weight)
        if key in done:
            continue
        done.add(key)
        members = groups[key]
        if not any(selected(n) for n in members) or any(
            any(fnmatch.fnmatchcase(n, p) for p in exclude) for n in members
        ):
            continue
        info = _describe(name, module)
        if len(members) > 1:
            _tie(info, name, module, members, candidates)
        info.note = _untracked_note(module, members, owners, named)
        chosen[name] = info
    if not chosen:
        raise LayerSelectionError(
            f"the layer selection (include {list(include)}, exclude {list(exclude)}) leaves no layer "
            f"of {_short(list(candidates))}; widen it."
        )
    return chosen


def _parameter_owners(named: dict[str, nn.Module]) -> dict[int, list[str]]:
    """id of each parameter -> every module holding it directly."""
    owners: dict[int, list[str]] = {}
    for name, module in named.items():
        for p in module._parameters.values():
            if p is not None:
                owners.setdefault(id(p), []).append(name)
    return owners


def _check_pattern(
    pattern: str, named: dict[str, nn.Module], candidates: dict[str, nn.Module], inert: set
) -> None:
    """Refuse an include pattern that matches no trackable module, or names modules that cannot be
    tracked (pointing at their trackable submodules where there are some)."""
    matched = [n for n in named if fnmatch.fnmatchcase(n, pattern)]
    unsupported = [n for n in matched if n not in candidates]
    explicit = not _has_wildcard(pattern) and pattern in named and pattern not in candidates
    if explicit or (matched and not any(n in candidates for n in matched)):
        types = sorted(
            {
                "out_proj of nn.MultiheadAttention (applied with F.linear, never called)"
                if n in inert
                else type(named[n]).__name__
                for n in unsupported
            }
        )
        children = [n for n in candidates if n.startswith(f"{unsupported[0]}.")] if unsupported else []
        hint = (
            f" Its trackable submodules are {_short(children)}: select them with '{unsupported[0]}.*'."
            if children
            else ""
        )
        raise LayerSelectionError(
            f"layer pattern {pattern!r} names {_short(unsupported)} of type {'; '.join(types)}, which "
            f"influence cannot track; the supported types are {SUPPORTED}.{hint} Fix influence "
            "layers in the config."
        )
    if not matched:
        raise LayerSelectionError(
            f"layer pattern {pattern!r} matches no Linear/Conv2d module (nor Conv1D); trackable "
            f"modules are {_short(list(candidates))}. Fix influence layers in the config."
        )


def _tie(info: LayerInfo, name: str, module: nn.Module, members: list[str], candidates: dict) -> None:
    """Make the modules sharing ``module``'s weight aliases of its layer; they must share its bias
    and shape too."""
    others = [candidates[n] for n in members[1:]]
    for other_name, other in zip(members[1:], others, strict=True):
        described = _describe(other_name, other)
        same_bias = getattr(other, "bias", None) is getattr(module, "bias", None)
        if (described.kind, described.out_dim, described.in_features) != (
            info.kind,
            info.out_dim,
            info.in_features,
        ) or not same_bias:
            raise LayerSelectionError(
                f"layers {name!r} and {other_name!r} share a weight but not their bias (or their "
                "shape); influence treats tied modules as one layer, which needs both tied. "
                "Exclude one of them with influence exclude_layers."
            )
    info.aliases = tuple(members[1:])
    info.extra_modules = tuple(others)


def _untracked_note(module: nn.Module, members: list[str], owners: dict, named: dict) -> str:
    """What a layer's note says of other modules that hold its weight or bias without being tracked
    ("" when none does)."""
    untracked = sorted(
        {
            n
            for p in (module.weight, getattr(module, "bias", None))
            if p is not None
            for n in owners.get(id(p), [])
            if n not in members
        }
    )
    if not untracked:
        return ""
    kinds = ", ".join(f"{n} ({type(named[n]).__name__})" for n in untracked)
    return f"weight shared with {kinds}, not tracked: the gradient through it is not included"


def _describe(name: str, module: nn.Module) -> LayerInfo:
    has_bias = getattr(module, "bias", None) is not None
    if isinstance(module, nn.Linear):
        return LayerInfo(name, module, "linear", module.out_features, module.in_features, has_bias)
    if not isinstance(module, nn.Conv2d):  # GPT-2 Conv1D: weight (nx, nf)
        nx, nf = module.weight.shape
        return LayerInfo(name, module, "conv1d", int(nf), int(nx), has_bias)
    if module.groups != 1:
        raise LayerSelectionError(
            f"layer {name!r}: Conv2d with groups={module.groups} is not supported by the KFC factors; "
            "exclude it with influence exclude_layers."
        )
    if module.padding_mode != "zeros":
        raise LayerSelectionError(
            f"layer {name!r}: Conv2d padding_mode={module.padding_mode!r} is not supported (only "
            "zeros); exclude it with influence exclude_layers."
        )
    kh, kw = module.kernel_size
    return LayerInfo(name, module, "conv2d", module.out_channels, module.in_channels * kh * kw, has_bias)


def _short(names: list[str], n: int = 12) -> str:
    return str(names) if len(names) <= n else f"{names[:n]} and {len(names) - n} more"
