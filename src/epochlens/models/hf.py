"""Hugging Face transformers built from local folders: nothing is downloaded.

A run's transformer is named by a folder holding its ``config.json`` (a ``save_pretrained`` folder,
a Trainer ``checkpoint-{step}`` folder, or a folder written by :func:`write_tiny_model`), and a
*task head*:

* ``sequence_classification``: ``AutoModelForSequenceClassification`` (BERT-, GPT-2-, Llama- and
  T5-style); ``num_labels`` comes from the data. GPT-2- and Llama-style classifiers read the logits
  at the last non-padding token, found through ``config.pad_token_id``: it is set from the
  tokenizer when the config has none (:func:`build_hf_model`, :func:`load_hf_model`).
* ``causal_lm``: ``AutoModelForCausalLM`` (GPT-2, Llama/Mistral-style).
* ``text_to_text``: ``AutoModelForSeq2SeqLM`` (encoder-decoder: T5, BART, ...): the prompt is
  the encoder's input, the target the decoder's labels (the model builds its decoder inputs from
  them, as in training).

:func:`build_hf_model` initialises a model from the config alone (seeded: training from scratch);
:func:`load_hf_model` reads the weights of a checkpoint: a ``save_pretrained`` or Trainer folder
(``model.safetensors``, ``pytorch_model.bin``, sharded, through ``from_pretrained`` with
``local_files_only``) or a state_dict file (``.pt``, what epochlens' training writes, or
``.safetensors``). Keys that do not fit are a :class:`~epochlens.errors.CheckpointError` listing
them, never a silent random initialisation. Models come in float32 (whatever dtype the files
hold: curvature and influence need it), in eval mode, with ``use_cache`` off (per-sample analyses
never generate) and the ``eager`` attention implementation by default (plain matrix products:
double backward for Hessian-vector products, identical results on every backend; ``sdpa`` is
faster for large models).

:func:`tiny_config` and :func:`write_tiny_model` make the tiny models of the demo and the tests
(2 layers, 2 heads, hidden 32) for every family of :mod:`epochlens.models.hf_catalog`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from epochlens.checkpoints import check_finite
from epochlens.errors import CheckpointError, ConfigError
from epochlens.models.hf_tiny import TINY_FAMILIES, tiny_config  # noqa: F401 (public here too)

#: Head kinds and the Auto class that builds each.
TASK_HEADS = ("sequence_classification", "causal_lm", "text_to_text")
CONFIG_FILE = "config.json"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass
class HFModelSettings:
    """How a run's transformer is built (the config's ``model`` section of a text run)."""

    folder: str = field(
        default="",
        metadata={"help": "folder with config.json (save_pretrained / Trainer checkpoint / tiny model)"},
    )
    task: str = field(
        default="sequence_classification",
        metadata={"help": "sequence_classification | causal_lm | text_to_text"},
    )
    attention: str = field(
        default="eager", metadata={"help": "attn_implementation: eager (exact double backward) | sdpa"}
    )


def _auto_class(task: str):
    import transformers

    if task == "sequence_classification":
        return transformers.AutoModelForSequenceClassification
    if task == "causal_lm":
        return transformers.AutoModelForCausalLM
    if task == "text_to_text":
        return transformers.AutoModelForSeq2SeqLM
    raise ConfigError(f"model task {task!r} must be one of {list(TASK_HEADS)}.")


def _offline() -> None:
    # Nothing is ever fetched: a missing local file is an error, not a download.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", "Writing model shards") off inside."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _config_folder(path: str | Path, what: str) -> Path:
    folder = Path(path)
    if folder.is_file() and folder.name == CONFIG_FILE:
        folder = folder.parent
    if not (folder / CONFIG_FILE).is_file():
        found = sorted(p.name for p in folder.iterdir())[:12] if folder.is_dir() else None
        where = f"it holds {found}" if found is not None else "no such folder"
        raise CheckpointError(
            f"{folder}: no {CONFIG_FILE} ({where}). The {what} must be a Hugging Face model folder "
            "(written by save_pretrained, a Trainer checkpoint-{step} folder, or "
            "epochlens.models.hf.write_tiny_model); nothing is downloaded, so a hub name does not work."
        )
    return folder


def config_from_mapping(spec: Mapping[str, Any], vocab_size: int | None = None):
    """A ``PretrainedConfig`` from a mapping as ``config.json`` holds it (``model_type`` and the
    sizes: the config's ``model.hf.config`` of a run the pipeline trains); ``vocab_size`` (the
    tokenizer's) when the mapping has none."""
    from transformers import AutoConfig

    spec = dict(spec)
    model_type = spec.pop("model_type", None)
    if not model_type:
        raise ConfigError("model.hf.config needs model_type (bert, gpt2, llama, t5, ...) and the sizes.")
    if vocab_size and "vocab_size" not in spec:
        spec["vocab_size"] = int(vocab_size)
    try:
        return AutoConfig.for_model(model_type, **spec)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"model.hf.config: transformers cannot build this config ({exc}).") from exc


def load_config(
    folder: str | Path | Mapping[str, Any],
    task: str,
    num_labels: int | None = None,
    pad_token_id: int | None = None,
    attention: str = "eager",
    vocab_size: int | None = None,
):
    """The ``PretrainedConfig`` in ``folder`` (or of a mapping: :func:`config_from_mapping`),
    adapted to the task: ``num_labels`` (classification), ``pad_token_id`` when the config has
    none, ``use_cache`` off and the attention implementation."""
    _offline()
    from transformers import AutoConfig

    if isinstance(folder, Mapping):
        config = config_from_mapping(folder, vocab_size)
    else:
        folder = _config_folder(folder, "model folder")
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"{folder / CONFIG_FILE}: transformers cannot read this config ({type(exc).__name__}: "
                f"{str(exc)[:300]}). Check model_type against the installed transformers version."
            ) from exc
    _auto_class(task)  # checks the task name
    if task == "sequence_classification" and num_labels is not None:
        if config.num_labels != num_labels:
            config.num_labels = int(num_labels)  # id2label / label2id follow
    if pad_token_id is not None and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = int(pad_token_id)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    config._attn_implementation = attention
    return config


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Draws inside come from ``torch.manual_seed(seed)``; the global generator is restored after."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _finish(model: nn.Module, task: str, folder: Path) -> nn.Module:
    model = model.to(torch.float32).eval()
    if task == "sequence_classification" and getattr(model.config, "pad_token_id", None) is None:
        model_type = getattr(model.config, "model_type", "?")
        if model_type in ("gpt2", "llama", "mistral", "qwen2"):
            raise ConfigError(
                f"{folder}: a {model_type} sequence classifier reads the logits at the last "
                "non-padding token and needs config.pad_token_id; give the tokenizer's pad token "
                "id (the tokenizer has none: set data.pad_token, e.g. to its eos token)."
            )
    return model


def build_hf_model(
    folder: str | Path | Mapping[str, Any],
    task: str = "sequence_classification",
    num_labels: int | None = None,
    pad_token_id: int | None = None,
    seed: int | None = 0,
    attention: str = "eager",
    vocab_size: int | None = None,
) -> nn.Module:
    """A freshly initialised model of the config in ``folder`` (its weight files are ignored), or
    of a config mapping (``model.hf.config``; ``vocab_size`` fills its vocabulary).

    With ``seed`` the initial weights are a function of it (torch's global generator is left as it
    was), as for :func:`epochlens.models.networks.build_model`.
    """
    config = load_config(folder, task, num_labels, pad_token_id, attention, vocab_size)
    with _seeded(seed):
        model = _auto_class(task).from_config(config, attn_implementation=attention)
    where = Path("model.hf.config") if isinstance(folder, Mapping) else Path(folder)
    return _finish(model, task, where)


def has_weights(folder: str | Path) -> bool:
    """True when ``folder`` holds model weights (see WEIGHT_FILES)."""
    return any((Path(folder) / name).is_file() for name in WEIGHT_FILES)


def load_hf_model(
    checkpoint: str | Path,
    task: str = "sequence_classification",
    num_labels: int | None = None,
    pad_token_id: int | None = None,
    config: str | Path | Mapping[str, Any] | None = None,
    attention: str = "eager",
    vocab_size: int | None = None,
) -> nn.Module:
    """The model with the weights of ``checkpoint``, float32, in eval mode, on the CPU.

    Args:
        checkpoint: a ``save_pretrained`` / Trainer ``checkpoint-{step}`` folder, or a state_dict
            file (``.pt``/``.bin`` as written by ``torch.save(model.state_dict())``, or
            ``.safetensors``).
        task: ``sequence_classification``, ``causal_lm`` or ``text_to_text``.
        num_labels: classes of the data (classification); must fit the checkpoint's head.
        pad_token_id: the tokenizer's pad token id, set on the config when it has none.
        config: the folder with ``config.json`` (or a config mapping, :func:`config_from_mapping`)
            when ``checkpoint`` is a file or a folder without one.
        attention: ``attn_implementation``.
        vocab_size: the tokenizer's, for a config mapping without one.

    Raises:
        CheckpointError: no config, no weights, or weights that do not fit (missing, unexpected or
            mismatched keys, listed).
    """
    path = Path(checkpoint)
    if path.is_dir():
        config_folder = path if (path / CONFIG_FILE).is_file() else config
        if config_folder is None:
            _config_folder(path, "checkpoint folder")  # raises, naming what the folder holds
        cfg = load_config(config_folder, task, num_labels, pad_token_id, attention, vocab_size)
        if not has_weights(path):
            found = sorted(p.name for p in path.iterdir())[:12]
            raise CheckpointError(
                f"{path}: no model weights (expected one of {list(WEIGHT_FILES)}; found {found}). An "
                "incomplete checkpoint (training interrupted or still writing): delete the folder, or "
                "wait for training to save it."
            )
        return _from_folder(path, cfg, task, attention)
    if config is None:
        raise CheckpointError(
            f"{path}: a weights file needs the model's config.json: give the model folder (config=...) "
            "or point the checkpoint at a save_pretrained folder."
        )
    model = build_hf_model(
        config, task, num_labels, pad_token_id, seed=0, attention=attention, vocab_size=vocab_size
    )
    if path.suffix == ".safetensors":
        state = _read_safetensors(path)
        _load_state(model, state, path)
    else:
        from epochlens.checkpoints import load_into

        load_into(model, path)
    return model.eval()


def _from_folder(path: Path, cfg, task: str, attention: str) -> nn.Module:
    """``from_pretrained`` of a checkpoint folder with its config, offline, the loading checked."""
    _offline()
    from safetensors import SafetensorError

    try:
        with _quiet():
            model, info = _auto_class(task).from_pretrained(
                path,
                config=cfg,
                local_files_only=True,
                dtype=torch.float32,
                attn_implementation=attention,
                output_loading_info=True,
            )
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        from epochlens.models.hf_heads import task_problem

        problem = task_problem(path / CONFIG_FILE, task) if (path / CONFIG_FILE).is_file() else None
        if problem or "Unrecognized configuration class" in str(exc):
            raise CheckpointError(
                (problem or f"{path}: model.hf.task {task} cannot load this model ({str(exc)[:200]})")
                + ". The files are fine: the model's type has no such head."
            ) from exc
        raise CheckpointError(
            f"{path}: transformers cannot load these weights ({type(exc).__name__}: {str(exc)[:300]}). "
            "The files are truncated or were written for another model: copy them again."
        ) from exc
    _check_loading(info, path, task)
    check_finite(model.state_dict(), path)
    return _finish(model, task, path)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found.")
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc}). Copy it again.") from exc


def _load_state(model: nn.Module, state: Mapping[str, torch.Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    # Tied weights (GPT-2's lm_head = wte) are saved once by save_pretrained.
    tied = {k for k in missing if _is_tied(model, k)}
    missing = [k for k in missing if k not in tied]
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    _raise_unfit(path, missing, unexpected, shapes)
    check_finite(state, path)
    model.load_state_dict({**expected, **{k: v.to(expected[k].dtype) for k, v in state.items()}})
    if tied:
        model.tie_weights()


def _is_tied(model: nn.Module, key: str) -> bool:
    tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {}
    return key in tied


def _check_loading(info: Mapping[str, Any], path: Path, task: str) -> None:
    missing = sorted(info.get("missing_keys", ()))
    unexpected = sorted(info.get("unexpected_keys", ()))
    mismatched = sorted(info.get("mismatched_keys", ()))
    shapes = [f"{k}: file {tuple(a)} vs model {tuple(b)}" for k, a, b in mismatched]
    conversion = info.get("conversion_errors") or {}
    errors = list(info.get("error_msgs", ())) + [f"{k}: {v}" for k, v in conversion.items()]
    hint = ""
    if task == "sequence_classification" and missing and not unexpected:
        hint = (
            " Only a classification head is missing: the folder holds a model saved without one "
            "(a base or language model); train a classifier from it first."
        )
    _raise_unfit(path, missing, unexpected, shapes, errors, hint)


def _raise_unfit(
    path: Path,
    missing: list[str],
    unexpected: list[str],
    shapes: list[str],
    errors: list[str] | None = None,
    hint: str = "",
) -> None:
    parts = []
    if missing:
        parts.append(f"missing keys {_short(missing)}")
    if unexpected:
        parts.append(f"unexpected keys {_short(unexpected)}")
    if shapes:
        parts.append(f"shape mismatches {_short(shapes)}")
    if errors:
        parts.append(f"errors {_short(errors)}")
    if parts:
        raise CheckpointError(
            f"{path}: the weights do not fit the model of the config ("
            + "; ".join(parts)
            + ")."
            + hint
            + " Point the model folder at the config that wrote these weights, and check the number "
            "of labels of the data against the classifier's head."
        )


def _short(items: list[str], n: int = 6) -> str:
    return str(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


# ------------------------------------------------------------------ tiny models for demo and tests
def write_tiny_model(
    folder: str | Path,
    config,
    task: str = "sequence_classification",
    seed: int = 0,
    tokenizer: Any = None,
    weights: bool = True,
) -> Path:
    """Write a tiny model to ``folder`` with ``save_pretrained`` (config.json, model.safetensors),
    seeded; with ``tokenizer`` its files too, so the folder loads like a user's. ``weights=False``
    writes the config alone (a run that trains from scratch needs nothing else)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _seeded(seed):
        model = _auto_class(task).from_config(config, attn_implementation="eager")
    if weights:
        with _quiet():
            model.save_pretrained(folder)
    else:
        model.config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


__all__ = [
    "TASK_HEADS",
    "TINY_FAMILIES",
    "HFModelSettings",
    "build_hf_model",
    "has_weights",
    "load_config",
    "load_hf_model",
    "tiny_config",
    "write_tiny_model",
]
