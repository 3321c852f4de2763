"""Hugging Face Trainer output folders: checkpoints, their weight files, step -> epoch. Torch-free.

``transformers.Trainer`` (``save_strategy="steps"`` or ``"epoch"``) writes into its ``output_dir``::

    output_dir/
      checkpoint-500/
        model.safetensors            (or model.safetensors.index.json + shards,
                                      or pytorch_model.bin / pytorch_model.bin.index.json)
        trainer_state.json           {"global_step": 500, "epoch": 1.28, "log_history": [...], ...}
        optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin, config.json (PreTrainedModel)
      checkpoint-1000/ ...

The checkpoint folders are found by listing ``output_dir`` (as ``transformers.trainer_utils``
does: names ``checkpoint-<digits>``), so the workflow can call :func:`list_trainer_checkpoints` while
it builds the DAG; the step is the folder's number. :func:`trainer_step_epochs` gives the training
epoch (a float: 1.28 = 28% into the second epoch) of every checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from epochlens.errors import CheckpointError

CHECKPOINT_DIR_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
# In the order transformers prefers them when loading.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

EpochSource = Literal["trainer_state", "log_history", "interpolated", "steps_per_epoch"]


@dataclass(frozen=True)
class TrainerCheckpoint:
    """One ``checkpoint-{step}`` folder and the training epoch it was written at."""

    step: int  # optimizer steps (the folder's number, the Trainer's global_step)
    epoch: float  # epochs of training data seen: 1.5 = half-way through the second epoch
    path: Path  # the checkpoint folder
    weights: Path  # its weight file (see WEIGHT_FILES)
    epoch_source: EpochSource  # where the epoch came from (see trainer_step_epochs)


def weights_file(checkpoint_dir: str | Path) -> Path:
    """The weight file of a Trainer checkpoint or ``save_pretrained`` folder (see WEIGHT_FILES).

    Raises:
        CheckpointError: no weight file in the folder, naming what was found and expected.
    """
    folder = Path(checkpoint_dir)
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    found = sorted(p.name for p in folder.iterdir())[:15] if folder.is_dir() else []
    hint = ""
    if any(n.startswith("adapter_model") for n in found):
        hint = " It holds a PEFT adapter, not the model's weights: merge the adapter and save the model."
    raise CheckpointError(
        f"{folder}: no model weights (expected one of {list(WEIGHT_FILES)}; found {found}).{hint} "
        "An incomplete checkpoint (training interrupted or still writing it): delete the folder or "
        "wait for training to save it."
    )


def list_trainer_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """``[(step, checkpoint folder)]`` of a Trainer ``output_dir``, sorted by step.

    Raises:
        CheckpointError: the folder does not exist, holds no ``checkpoint-{step}`` folders (naming
            what it holds and what was expected), or a checkpoint folder has no weight file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder}: no such folder. Set checkpoints.path to the output_dir of the Hugging Face "
            "Trainer run (the folder holding checkpoint-{step}/ folders)."
        )
    found = []
    for entry in folder.iterdir():
        match = CHECKPOINT_DIR_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    if not found:
        names = sorted(p.name for p in folder.iterdir())
        hint = ""
        if any(n in names for n in WEIGHT_FILES):
            hint = (
                " It holds a single saved model (a final save_model/save_pretrained folder), not "
                "checkpoints: point checkpoints.path at the Trainer's output_dir, or give this folder "
                "as a single checkpoint."
            )
        raise CheckpointError(
            f"{folder}: no checkpoint-{{step}}/ folders (found {names[:15]}"
            f"{' ...' if len(names) > 15 else ''}).{hint} Expected the output_dir of "
            "transformers.Trainer trained with save_strategy='steps' or 'epoch' (and save_total_limit "
            "large enough to keep the checkpoints to analyse)."
        )
    found.sort()
    for _, path in found:
        weights_file(path)
    return found


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """The JSON of a ``trainer_state.json``; CheckpointError naming the file if it is unreadable."""
    path = Path(path)
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path}: unreadable trainer_state.json ({type(exc).__name__}: {exc}). Copy it again from "
            "the training run, or delete it to fall back on the other checkpoints' states."
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path}: trainer_state.json must hold a JSON object, got {type(state).__name__}."
        )
    return state


def trainer_step_epochs(folder: str | Path, steps_per_epoch: float | None = None) -> list[TrainerCheckpoint]:
    """Every checkpoint of a Trainer ``output_dir`` with the epoch it was written at.

    The epoch of ``checkpoint-{step}`` comes from, in order:

    1. ``trainer_state``: its own ``trainer_state.json`` (``epoch`` where ``global_step == step``);
    2. ``log_history``: an entry with ``"step": step`` in the ``log_history`` of any
       ``trainer_state.json`` of the run (the checkpoints' and the output_dir's own);
    3. ``interpolated``: ``step * epoch / global_step`` of the latest state known (the Trainer's
       epoch grows linearly with the step when every epoch has the same number of steps);
    4. ``steps_per_epoch``: ``step / steps_per_epoch`` if given (a run without trainer states).

    Raises:
        CheckpointError: as :func:`list_trainer_checkpoints`; an unreadable ``trainer_state.json``;
            no epoch for a checkpoint by any of the above.
    """
    folder = Path(folder)
    checkpoints = list_trainer_checkpoints(folder)
    own, logged, anchor = _known_epochs(folder, checkpoints)
    rows = []
    for step, path in checkpoints:
        source: EpochSource
        if step in own:
            epoch, source = own[step], "trainer_state"
        elif step in logged:
            epoch, source = logged[step], "log_history"
        elif anchor is not None:
            epoch, source = step * anchor[1] / anchor[0], "interpolated"
        elif steps_per_epoch:
            epoch, source = step / steps_per_epoch, "steps_per_epoch"
        else:
            raise CheckpointError(
                f"{path}: no {TRAINER_STATE} in this or any other checkpoint of {folder}, so its step "
                f"{step} cannot be mapped to an epoch. Copy the checkpoints with their {TRAINER_STATE}, "
                "or set checkpoints.steps_per_epoch in the config."
            )
        rows.append(TrainerCheckpoint(step, epoch, path, weights_file(path), source))
    return rows


def _known_epochs(
    folder: Path, checkpoints: list[tuple[int, Path]]
) -> tuple[dict[int, float], dict[int, float], tuple[int, float] | None]:
    """What the run's trainer states say (:func:`trainer_step_epochs`): each checkpoint's own epoch,
    the epochs of logged steps, and the latest (global_step, epoch) known (None: no state)."""
    own: dict[int, float] = {}
    logged: dict[int, float] = {}
    anchors: list[tuple[int, float]] = []
    states = [(step, path / TRAINER_STATE) for step, path in checkpoints]
    states.append((None, folder / TRAINER_STATE))
    for step, state_path in states:
        if not state_path.is_file():
            continue
        state = read_trainer_state(state_path)
        global_step, epoch = state.get("global_step"), state.get("epoch")
        if _is_number(global_step) and _is_number(epoch):
            if step is not None and int(global_step) == step:
                own[step] = float(epoch)
            if global_step > 0:
                anchors.append((int(global_step), float(epoch)))
        for entry in state.get("log_history") or []:
            if isinstance(entry, dict) and _is_number(entry.get("step")) and _is_number(entry.get("epoch")):
                logged.setdefault(int(entry["step"]), float(entry["epoch"]))
    return own, logged, max(anchors) if anchors else None


def step_epoch_table(folder: str | Path, steps_per_epoch: float | None = None):
    """:func:`trainer_step_epochs` as a ``pandas.DataFrame`` with columns step, epoch, epoch_source,
    path (one row per checkpoint, sorted by step), for tables and figures."""
    import pandas as pd

    rows = trainer_step_epochs(folder, steps_per_epoch)
    return pd.DataFrame(
        {
            "step": [r.step for r in rows],
            "epoch": [r.epoch for r in rows],
            "epoch_source": [r.epoch_source for r in rows],
            "path": [str(r.path) for r in rows],
        }
    )


def training_epochs(
    checkpoint_template: str, index: int, steps: list[int], steps_per_epoch: float | None = None
) -> dict[int, float] | None:
    """``{step: training epoch}`` of the analysed checkpoints of a run whose ``checkpoints.path`` is a
    Trainer folder (``.../checkpoint-{epoch}``: the ``{epoch}`` wildcard holds the step; its states,
    else ``steps_per_epoch``); None for any other checkpoint layout."""
    paths = [Path(checkpoint_template.format(index=index, epoch=step)) for step in steps]
    if not paths or not all(p.is_dir() and CHECKPOINT_DIR_RE.fullmatch(p.name) for p in paths):
        return None
    parents = {p.parent for p in paths}
    if len(parents) != 1:
        return None
    epochs = {row.step: row.epoch for row in trainer_step_epochs(parents.pop(), steps_per_epoch)}
    return {step: epochs[step] for step in steps}


def insert_training_epochs(table: Any, checkpoints: Mapping[str, Any]) -> bool:
    """Insert a ``train_epoch`` column after ``epoch`` in ``table`` (a DataFrame with ``index`` and
    ``epoch`` columns, the epochs being a Trainer folder's steps), read per replicate from its
    ``trainer_state.json`` (:func:`training_epochs`). Nothing for checkpoints that are not Trainer
    folders (the config's ``checkpoints`` section). Returns whether the column was inserted."""
    if checkpoints.get("source") != "folder" or table.empty:
        return False
    steps = sorted({int(e) for e in table["epoch"]})
    per_epoch = checkpoints.get("steps_per_epoch")
    epochs = {
        int(i): training_epochs(checkpoints["path"], int(i), steps, per_epoch)
        for i in table["index"].unique()
    }
    if not all(epochs.values()):
        return False
    train_epoch = [epochs[int(i)][int(e)] for i, e in zip(table["index"], table["epoch"], strict=True)]
    table.insert(table.columns.get_loc("epoch") + 1, "train_epoch", train_epoch)
    return True


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
