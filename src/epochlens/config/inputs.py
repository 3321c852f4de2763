"""Where a run's checkpoints are, and which of them are missing (torch-free).

Every checkpoint input of the workflow is resolved by :func:`checkpoint_path` (the pipeline's own
under ``results/`` when it trains, the user's ``checkpoints.path`` template otherwise), so that
one function knows where a checkpoint is. :func:`missing_checkpoints` checks every checkpoint a
configuration needs (each folder run's indices x analysed epochs) at once, and
:func:`missing_checkpoints_message` says which files are missing and what to do, in one message,
instead of one missing file per attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from epochlens.config.epochs import analysis_epochs
from epochlens.layout import RESULTS, Layout

#: The rule whose jobs stand for missing checkpoints under --keep-going (rules/common.smk).
MISSING_RULE = "missing_checkpoint"
#: At most this many paths are listed in a message; the rest are counted.
MAX_LISTED = 20


@dataclass(frozen=True)
class MissingCheckpoint:
    """A checkpoint that a run needs and that is not on disk."""

    run: str
    index: int
    epoch: int
    path: str


def checkpoint_path(
    run_name: str, run: Mapping, index: int | str, epoch: int | str, layout: Layout = RESULTS
) -> str:
    """The checkpoint of (``run_name``, ``index``, ``epoch``): the pipeline's own file when it trains
    the run (``checkpoints.source: train``) or runs the user's training command (``command``),
    else the run's ``checkpoints.path`` template filled in.

    ``index`` and ``epoch`` may be the digits of Snakemake wildcards ("0", "0400").
    """
    ckpt = run["checkpoints"]
    if ckpt["source"] in ("train", "command"):
        return layout.checkpoint(run_name, index, epoch)
    return ckpt["path"].format(index=int(index), epoch=int(epoch))


def needs_file(run: Mapping) -> bool:
    """Whether the run's checkpoints are files the user provides (not made by a pipeline job)."""
    return run["checkpoints"]["source"] == "folder"


def missing_checkpoints(config: Mapping) -> list[MissingCheckpoint]:
    """Every checkpoint that ``config`` (validated, defaults filled) needs and that does not exist:
    each run reading the user's checkpoints, each index, each analysed epoch (every other stage
    analyses a subset of those), in run, index, epoch order."""
    missing = []
    for name, run in config["runs"].items():
        if not needs_file(run):
            continue
        epochs = analysis_epochs(name, run)
        for index in run["indices"]:
            for epoch in epochs:
                path = checkpoint_path(name, run, index, epoch)
                if not Path(path).exists():
                    missing.append(MissingCheckpoint(name, int(index), int(epoch), path))
    return missing


def missing_checkpoints_message(missing: list[MissingCheckpoint], config: Mapping, keep_going: bool) -> str:
    """One message for every missing checkpoint: how many of each run's, the files (up to
    :data:`MAX_LISTED`), the fix, and what happens now (``keep_going``: the other epochs run)."""
    runs = list(dict.fromkeys(m.run for m in missing))
    counts = []
    for name in runs:
        run = config["runs"][name]
        needed = len(run["indices"]) * len(analysis_epochs(name, run))
        n = sum(m.run == name for m in missing)
        counts.append(f"run {name}: {n} of {needed}" + (" (none found)" if n == needed else ""))
    lines = [f"{len(missing)} checkpoint(s) that the config needs are missing ({'; '.join(counts)}):"]
    lines += [f"  {m.path}  (run {m.run}, index {m.index}, epoch {m.epoch})" for m in missing[:MAX_LISTED]]
    if len(missing) > MAX_LISTED:
        lines.append(f"  ... and {len(missing) - MAX_LISTED} more")
    for name in runs:
        template = config["runs"][name]["checkpoints"]["path"]
        folder = Path(template).parent
        if "{" not in str(folder) and not folder.is_dir():
            lines.append(f"  (run {name}: the folder {folder} does not exist)")
    keys = ", ".join(f"runs.{name}" for name in runs)
    lines.append(
        "Fix: copy the missing files from the training run; or correct checkpoints.path of "
        f"{keys} (its {{index}} and {{epoch}} placeholders); or analyse only what you have with "
        "the run's epochs: [...] and indices: [...]."
    )
    if keep_going:
        lines.append(
            f"With --keep-going, each missing checkpoint's job ({MISSING_RULE}) fails with this "
            "fix and the epochs whose checkpoints exist run; the run's tables and figures wait "
            "for all of them."
        )
    else:
        lines.append(
            "Nothing was run. With --keep-going (on in profiles/default and profiles/slurm), the "
            "epochs whose checkpoints exist run and only the missing ones fail."
        )
    return "\n".join(lines)


def missing_checkpoint_error(missing: MissingCheckpoint, config: Mapping) -> str:
    """The error of the job that stands for one missing checkpoint (rule ``missing_checkpoint``)."""
    run = config["runs"][missing.run]
    return (
        f"{missing.path}: checkpoint not found (run {missing.run}, index {missing.index}, epoch "
        f"{missing.epoch}); checkpoints.path of runs.{missing.run} is "
        f"{run['checkpoints']['path']}. Copy the file from the training run, correct "
        f"runs.{missing.run}.checkpoints.path, or leave epoch {missing.epoch} out of "
        f"runs.{missing.run}.epochs; then run the workflow again (it computes only what is missing)."
    )
