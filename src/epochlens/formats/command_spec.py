"""A training command's spec (``checkpoints`` of a run with ``source: command``) and its template:
the placeholders (:data:`PLACEHOLDERS`), filled shell-quoted (:func:`fill_command`). Torch-free.
See :mod:`epochlens.formats.command`.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochlens.errors import EpochlensError

#: Placeholders of a command template and what they become (README "Your own training script").
PLACEHOLDERS = {
    "index": "the replicate index",
    "seed": "train.seed + index (the seed the pipeline's own training uses for this index)",
    "output": "an empty folder (on the first attempt) that the command writes its checkpoints into",
    "resume": "a folder kept across attempts of the same job, for the command's resume state",
    "data": "an .npz export of the run's prepared data set (x_train, y_train, x_test, y_test, holdout)",
    "threads": "the job's threads (Snakemake's threads of the rule)",
    "subset": "an .npy of int64 positions in {data}'s x_train to train on: every non-holdout position "
    "for the run's own training, a random subset for an LDS retraining",
}
#: Placeholders whose value is known when the workflow is planned (files may be named with them).
PLAN_PLACEHOLDERS = ("index", "seed")


class CommandError(EpochlensError):
    """A training command that cannot be planned, pinned or run, or whose checkpoints are missing."""


@dataclass(frozen=True)
class CommandSpec:
    """The ``checkpoints`` section of a run with ``source: command``.

    Attributes:
        run: the run's name (for messages: ``runs.<run>.checkpoints...``).
        command: the command template (a shell command line; see :data:`PLACEHOLDERS`).
        path: where the command writes the checkpoint of an epoch, relative to ``{output}``; has
            ``{epoch}`` (optionally formatted, ``{epoch:04d}``) and may have ``{index}``.
        repository: a folder inside the git repository of the code; None: the working directory.
        files: further files the command reads (inputs, pinned when inside the repository).
        allow_dirty: run from a tree with uncommitted changes (recorded as dirty).
    """

    run: str
    command: str
    path: str
    repository: str | None = None
    files: tuple[str, ...] = ()
    allow_dirty: bool = False
    key: str = field(default="checkpoints", repr=False)

    @classmethod
    def from_config(cls, name: str, run: Mapping[str, Any]) -> CommandSpec:
        ckpt = run["checkpoints"]
        return cls(
            run=name,
            command=ckpt["command"],
            path=ckpt["path"],
            repository=ckpt.get("repository"),
            files=tuple(ckpt.get("files") or ()),
            allow_dirty=bool(ckpt.get("allow_dirty", False)),
            key=f"runs.{name}.checkpoints",
        )

    @property
    def placeholders(self) -> set[str]:
        return set(template_fields(self.command, f"{self.key}.command"))

    @property
    def uses_data(self) -> bool:
        """Whether the command reads the ``{data}`` export."""
        return "data" in self.placeholders

    @property
    def uses_subset(self) -> bool:
        """Whether the command accepts a training-subset file (``{subset}``: int64 positions in
        ``{data}``'s x_train), the contract that lets the pipeline retrain it for LDS."""
        return "subset" in self.placeholders

    @property
    def needs_data(self) -> bool:
        """Whether the job needs the ``{data}`` export: the command reads it, or its ``{subset}``
        is made from the export's holdout."""
        return self.uses_data or self.uses_subset

    def check(self) -> None:
        """The templates' placeholders (raises CommandError naming the key)."""
        unknown = sorted(self.placeholders - set(PLACEHOLDERS))
        if unknown:
            known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise CommandError(
                f"{self.key}.command: unknown placeholder(s) {['{' + u + '}' for u in unknown]}; the "
                f"placeholders are {known}. Write a literal brace doubled (${{{{HOME}}}}), or $HOME."
            )
        if "output" not in self.placeholders:
            raise CommandError(
                f"{self.key}.command has no {{output}}: the command must be told where to write "
                "its checkpoints (a folder the pipeline makes; checkpoints.path is relative to it)."
            )
        fields_ = template_fields(self.path, f"{self.key}.path")
        if "epoch" not in fields_ or set(fields_) - {"epoch", "index"}:
            raise CommandError(
                f"{self.key}.path {self.path!r}: a file name relative to {{output}} with {{epoch}} "
                "(and optionally {index}), e.g. ckpt_{epoch}.pt or epoch_{epoch:04d}.pt."
            )
        if Path(self.path).is_absolute() or ".." in Path(self.path).parts:
            raise CommandError(
                f"{self.key}.path {self.path!r} must be relative to the command's {{output}} folder "
                "(no absolute path, no ..)."
            )

    def checkpoint_name(self, index: int, epoch: int) -> str:
        """The file (relative to ``{output}``) the command writes for ``epoch``."""
        return self.path.format(epoch=int(epoch), index=int(index))


def template_fields(template: str, key: str = "command") -> list[str]:
    """The placeholder names of a format template, in order (``{epoch:04d}`` gives ``epoch``)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise CommandError(
            f"{key} {template!r}: {exc}. Placeholders are written {{name}}; a literal brace doubled."
        ) from None
    names = []
    for _, name, _, conversion in parsed:
        if name is None:
            continue
        if conversion or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise CommandError(
                f"{key} {template!r}: {{{name}{'!' + conversion if conversion else ''}}} is not a "
                "placeholder; write {name} (a literal brace doubled)."
            )
        names.append(name)
    return names


class _QuotingFormatter(string.Formatter):
    """Fills placeholders shell-quoted (a path with spaces stays one argument); leaves the names in
    ``keep`` as they are."""

    def __init__(self, keep: Iterable[str] = ()) -> None:
        self.keep = set(keep)

    def get_value(self, key, args, kwargs):  # noqa: D401 - string.Formatter API
        if key in self.keep:
            return _Kept(key)
        return kwargs[key]

    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, _Kept):
            return "{" + value.name + (":" + format_spec if format_spec else "") + "}"
        return shlex.quote(format(value, format_spec))


@dataclass(frozen=True)
class _Kept:
    name: str


def fill_command(template: str, values: Mapping[str, Any], keep: Iterable[str] = ()) -> str:
    """``template`` with every placeholder replaced by its value, shell-quoted; the placeholders in
    ``keep`` stay as they are (e.g. to find the files named before the job's folders exist)."""
    missing = [name for name in template_fields(template) if name not in values and name not in keep]
    if missing:
        raise CommandError(f"no value for placeholder(s) {missing} of the command {template!r}")
    return _QuotingFormatter(keep).vformat(template, (), dict(values))


def fill_plain(template: str, index: int, seed: int, key: str = "files") -> str:
    """A file name with ``{index}`` and ``{seed}`` filled in (no quoting)."""
    unknown = set(template_fields(template, key)) - set(PLAN_PLACEHOLDERS)
    if unknown:
        raise CommandError(f"{key}: {template!r} may use {{index}} and {{seed}} only, not {sorted(unknown)}.")
    return template.format(index=int(index), seed=int(seed))


def seed_of(run: Mapping[str, Any], index: int | str) -> int:
    """``{seed}``: the run's ``train.seed`` plus the index, as the pipeline's own training."""
    return int(run.get("train", {}).get("seed", 0)) + int(index)


def command_params(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the checkpoints of a run's command depend on besides its files and data (the params of
    its training jobs): the template, the checkpoint path, the epochs and, where the command uses
    ``{seed}``, ``train.seed``. Never the commit: a commit that leaves the command's files as they
    were (analysis code, notes) retrains nothing; nor ``key``, ``repository`` or ``allow_dirty``."""
    ckpt = run["checkpoints"]
    params = {"command": ckpt["command"], "path": ckpt["path"], "epochs": sorted(run["epochs"])}
    if "seed" in template_fields(ckpt["command"]):
        params["seed"] = int(run.get("train", {}).get("seed", 0))
    return params
