"""Loading a model's weights from the checkpoint layouts users have, and fitting them to the model.

:func:`load_weights` dispatches on the layout of ``path``:

* a folder: a Trainer ``checkpoint-{step}/`` or ``save_pretrained`` folder (its weight file, see
  :data:`epochlens.formats.trainer_folders.WEIGHT_FILES`);
* ``*.safetensors``: a safetensors file;
* ``*.index.json``: a sharded checkpoint (``weight_map`` from parameter name to shard file), shards
  as safetensors or ``torch.save`` files;
* anything else (``.pt``, ``.pth``, ``.bin``, ``.ckpt``): ``torch.load(weights_only=True)`` of a bare
  state_dict or a dict holding it under ``key`` (``checkpoints.key``; by default the first of
  ``state_dict``, ``model_state_dict``, ``model_weights``, ``model`` that holds tensors).

For flat files (safetensors, a flat state_dict), ``key`` selects the tensors whose names start with
``key + "."`` and removes that prefix. :func:`fit_weights` loads a state_dict into a model and, when
the keys do not fit, says how: missing/unexpected keys, shape mismatches, a prefix whose removal makes
them fit (``module.`` of DDP, ``model.`` of Lightning or a wrapper), and the closest of a set of
candidate models.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from epochlens.checkpoints import _WRAPPER_KEYS, check_finite
from epochlens.errors import CheckpointError
from epochlens.formats.trainer_folders import CHECKPOINT_DIR_RE, weights_file

StateDict = dict[str, torch.Tensor]
# Prefixes that only wrappers add (DDP / DataParallel, torch.compile): removed without asking.
AUTO_STRIP = ("module.", "_orig_mod.")


def load_weights(path: str | Path, key: str | None = None) -> StateDict:
    """The state_dict (name -> CPU tensor) stored at ``path``; see the module docstring for layouts.

    Args:
        path: a file or a checkpoint folder.
        key: where the weights are inside the file (``checkpoints.key``): a key of the saved dict
            (dotted for nested dicts: ``"ema.model"``), or for flat files a name prefix. None: the
            file is a state_dict, or one of the usual wrapper keys holds it.

    Raises:
        CheckpointError: missing or unreadable file, no weights under ``key``, non-tensor values;
            each naming the file, what it holds and the fix.
    """
    path = Path(path)
    if path.is_dir():
        if any(CHECKPOINT_DIR_RE.match(p.name) for p in path.iterdir()):
            steps = sorted(p.name for p in path.iterdir() if CHECKPOINT_DIR_RE.match(p.name))
            raise CheckpointError(
                f"{path}: a Trainer output folder holding {len(steps)} checkpoints ({steps[:5]}...); "
                "name one checkpoint-{step} folder, or list them with list_trainer_checkpoints."
            )
        path = weights_file(path)
    if not path.is_file():
        raise CheckpointError(
            f"{path}: checkpoint not found. Check checkpoints.path in the config, or train the run first."
        )
    name = path.name
    if name.endswith(".index.json"):
        return _select(_load_sharded(path), key, path)
    if name.endswith(".safetensors"):
        return _select(_load_safetensors(path), key, path)
    return _select(_torch_load(path), key, path)


def _load_safetensors(path: Path) -> StateDict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return dict(load_file(str(path), device="cpu"))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{path}: cannot read the safetensors file ({type(exc).__name__}: {str(exc)[:200]}). It is "
            "truncated or not safetensors: copy it again from the training run."
        ) from exc


def _torch_load(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
        raise CheckpointError(
            f"{path}: cannot read the checkpoint ({type(exc).__name__}: {str(exc)[:200]}). The file "
            "is truncated or corrupt: copy it again from the training run."
        ) from exc
    except Exception as exc:  # unpickling of arbitrary objects, refused by weights_only
        text = str(exc)
        if "Unsupported global:" in text:  # the line naming the class weights_only refused
            text = text[text.index("Unsupported global:") :].split(" was not")[0]
        raise CheckpointError(
            f"{path}: holds Python objects that cannot be loaded safely ({type(exc).__name__}: "
            f"{' '.join(text.split())[:200]}). Save the weights with "
            "torch.save({'model': model.state_dict(), ...}) (tensors, numbers and strings only) or as "
            "safetensors."
        ) from exc


def _load_sharded(index: Path) -> StateDict:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{index}: not a sharded-checkpoint index ({type(exc).__name__}: {exc}); it must hold "
            '{"weight_map": {parameter name: shard file}}. Copy it again from the training run.'
        ) from exc
    state: StateDict = {}
    for shard in dict.fromkeys(weight_map.values()):
        shard_path = index.parent / shard
        if not shard_path.is_file():
            raise CheckpointError(
                f"{index}: shard {shard} is missing from {index.parent}; copy every shard listed in "
                "the index."
            )
        part = _load_safetensors(shard_path) if shard.endswith(".safetensors") else _torch_load(shard_path)
        if not isinstance(part, Mapping):
            raise CheckpointError(f"{shard_path}: a shard must hold a state_dict, got {type(part).__name__}.")
        state.update(part)
    absent = [k for k in weight_map if k not in state]
    if absent:
        raise CheckpointError(
            f"{index}: the shards lack {len(absent)} tensors the index lists ({absent[:6]}); the "
            "checkpoint is incomplete: copy it again."
        )
    return state


def _select(obj: object, key: str | None, path: Path) -> StateDict:
    """The state_dict inside a loaded object (see :func:`load_weights`)."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"{path}: expected a state_dict (name -> tensor) or a dict holding one, got "
            f"{type(obj).__name__}. Save checkpoints with torch.save(model.state_dict(), path)."
        )
    if key is not None:
        found = _lookup(obj, key)
        if found is None:
            prefixed = {
                k[len(key) + 1 :]: v for k, v in obj.items() if isinstance(k, str) and k.startswith(key + ".")
            }
            if prefixed:
                found = prefixed
        if found is None:
            raise CheckpointError(
                f"{path}: checkpoints.key={key!r} not found; the file holds {_summary(obj)}. Set "
                "checkpoints.key to the entry with the model's weights (or remove it to detect "
                f"{list(_WRAPPER_KEYS)})."
            )
        obj = found
    elif not _all_tensors(obj):
        for wrapper in _WRAPPER_KEYS:
            if isinstance(obj.get(wrapper), Mapping) and _all_tensors(obj[wrapper]):
                obj = obj[wrapper]
                break
        else:
            raise CheckpointError(
                f"{path}: not a state_dict and none of {list(_WRAPPER_KEYS)} holds one; the file holds "
                f"{_summary(obj)}. Set checkpoints.key in the config to the entry with the model's weights."
            )
    if not isinstance(obj, Mapping) or not obj or not _all_tensors(obj):
        what = _summary(obj) if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"{path}: the weights under checkpoints.key={key!r} are not a state_dict of tensors "
            f"({what}). Name the entry that holds name -> tensor."
        )
    return {str(k): v for k, v in obj.items()}


def _lookup(obj: Mapping, key: str) -> Mapping | None:
    if key in obj and isinstance(obj[key], Mapping):
        return obj[key]
    node: object = obj
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None


def _all_tensors(obj: Mapping) -> bool:
    return all(isinstance(v, torch.Tensor) for v in obj.values())


def _summary(obj: Mapping, n: int = 12) -> str:
    items = list(obj.items())
    text = ", ".join(
        f"{k!r}: {'tensor ' + str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__}"
        for k, v in items[:n]
    )
    return "{" + text + (f", ... ({len(items) - n} more)" if len(items) > n else "") + "}"


# ---------------------------------------------------------------------------------------------
# Fitting a state_dict to a model


@dataclass
class KeyFit:
    """How a state_dict's keys and shapes compare with a model's."""

    missing: list[str] = field(default_factory=list)  # in the model, not in the file
    unexpected: list[str] = field(default_factory=list)  # in the file, not in the model
    shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )  # key, file, model

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.shapes)

    def describe(self, n: int = 6) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing keys {_first(self.missing, n)}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected keys {_first(self.unexpected, n)}")
        if self.shapes:
            shapes = [f"{k}: file {f} vs model {m}" for k, f, m in self.shapes]
            parts.append(f"{len(shapes)} shape mismatches {_first(shapes, n)}")
        return "; ".join(parts) if parts else "all keys and shapes fit"


def shapes_of(model_or_state: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of a model's state_dict or of a state_dict."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    return {k: tuple(v.shape) for k, v in state.items()}


def compare_keys(state: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]]) -> KeyFit:
    """Missing and unexpected keys and shape mismatches of ``state`` against ``expected`` shapes."""
    have = {k: tuple(v.shape) for k, v in state.items()}
    return KeyFit(
        missing=sorted(set(expected) - set(have)),
        unexpected=sorted(set(have) - set(expected)),
        shapes=[
            (k, have[k], tuple(expected[k]))
            for k in sorted(set(have) & set(expected))
            if have[k] != tuple(expected[k])
        ],
    )


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> StateDict:
    """The tensors whose names start with ``prefix``, with it removed (the others are dropped)."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def suggest_prefix(state_keys: list[str], model_keys: list[str]) -> tuple[str, str] | None:
    """A prefix change that makes more keys fit: ``("strip", p)`` when the file's keys carry an extra
    ``p`` (``model.``, ``module.``, ``net.``), ``("add", p)`` when the model's keys do (the model wraps
    the network the file holds, e.g. ``backbone.``). None when no prefix of up to three name parts
    fits more keys than the names as they are."""
    model_set, state_set = set(model_keys), set(state_keys)
    best: tuple[int, tuple[str, str] | None] = (len(model_set & state_set), None)
    for keys, other, kind in ((state_keys, model_set, "strip"), (model_keys, state_set, "add")):
        prefixes = {".".join(k.split(".")[:i]) + "." for k in keys for i in (1, 2, 3) if k.count(".") >= i}
        for p in sorted(prefixes):
            fit = sum(1 for k in keys if k.startswith(p) and k[len(p) :] in other)
            if fit > best[0]:
                best = (fit, (kind, p))
    return best[1]


def fit_weights(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str | Path,
    strip: str | None = None,
    strict: bool = True,
    candidates: Mapping[str, Mapping[str, tuple[int, ...]]] | None = None,
) -> KeyFit:
    """Load ``state`` into ``model`` after removing wrapper prefixes; explain keys that do not fit.

    Args:
        model: the model to load into (its parameters keep their dtype and device).
        state: name -> tensor, e.g. from :func:`load_weights`.
        source: the file the state came from, named in errors.
        strip: a prefix to remove from every key first (``checkpoints.strip_prefix``); keys without it
            are dropped. ``module.`` / ``_orig_mod.`` on every key are removed anyway.
        strict: every model key must be in the file and no file key may be left over. With False,
            missing and unexpected keys are allowed (reported in the returned KeyFit); shape
            mismatches never are.
        candidates: name -> key shapes (:func:`shapes_of`) of models the run could mean (built-ins,
            the configured factory); the error names the closest one.

    Returns:
        The KeyFit of the loaded keys (``ok`` unless strict=False let something through).

    Raises:
        CheckpointError: keys or shapes do not fit, listing the first missing/unexpected keys and
            mismatched shapes, a prefix change that makes them fit, and the closest candidate.
    """
    state = dict(state)
    if strip:
        state = strip_prefix(state, strip)
        if not state:
            raise CheckpointError(
                f"{source}: no key starts with checkpoints.strip_prefix={strip!r}; remove the setting "
                "or fix it."
            )
    for prefix in AUTO_STRIP:
        if state and all(k.startswith(prefix) for k in state):
            state = strip_prefix(state, prefix)
    expected = shapes_of(model)
    fit = compare_keys(state, expected)
    if fit.shapes or (strict and not fit.ok):
        raise CheckpointError(_misfit_message(model, state, expected, fit, source, candidates))
    check_finite(state, source)
    model.load_state_dict(state, strict=False)
    return fit


def _misfit_message(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    fit: KeyFit,
    source: str | Path,
    candidates: Mapping[str, Mapping[str, tuple[int, ...]]] | None,
) -> str:
    lines = [f"{source}: the weights do not fit {type(model).__name__} ({fit.describe()})."]
    change = suggest_prefix(list(state), list(expected))
    if change is not None:
        kind, prefix = change
        if kind == "strip":
            after = compare_keys(strip_prefix(state, prefix), expected)
            lines.append(
                f"The file's keys carry the prefix {prefix!r} (a Lightning module or training wrapper); "
                f"without it: {after.describe()}. Set checkpoints.strip_prefix: {prefix!r} in the config."
            )
        else:
            after = compare_keys({prefix + k: v for k, v in state.items()}, expected)
            lines.append(
                f"The model's keys carry the prefix {prefix!r} that the file's lack (the model wraps the "
                f"network that was saved); with it: {after.describe()}. Build the inner network "
                f"(model.factory) or save the checkpoint from the wrapper."
            )
    if candidates:
        have = {(k, tuple(v.shape)) for k, v in state.items()}
        scores = {
            name: len(have & {(k, tuple(s)) for k, s in shapes.items()})
            / max(len(have | set(shapes.items())), 1)
            for name, shapes in candidates.items()
        }
        closest = max(scores, key=scores.__getitem__)
        lines.append(
            f"Of the models {sorted(scores)}, the keys look most like {closest!r} "
            f"({scores[closest]:.0%} of names and shapes shared)."
        )
    lines.append(
        "Set model.factory/model.kwargs (or model.name) to the architecture that wrote this checkpoint, "
        "or checkpoints.key to the entry holding its weights."
    )
    return " ".join(lines)


def _first(items: list[str], n: int) -> str:
    return str(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")
