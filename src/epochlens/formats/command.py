"""The user's own training command (``checkpoints.source: command``). Torch-free.

A run may name a command that trains one replicate (its index) and writes checkpoints::

    checkpoints:
      source: command
      command: "python code/train.py --config code/configs/q001.json --seed {seed} --data {data}
                --out {output} --resume {resume}"
      path: "ckpt_{epoch}.pt"        # what the command writes, relative to {output}
      key: model                     # the weights inside the saved dict
      repository: code               # the git repository of the code (default: the working
                                     # directory's)
      files: [code/configs/q001.json]  # further inputs (files named in the command are found)
      allow_dirty: false

The workflow runs it once per index as a job (rules/train.smk); this module is everything around
it that knows nothing of Snakemake:

* the command as a template: its placeholders (:data:`PLACEHOLDERS`), filled shell-quoted
  (:func:`fill_command`);
* the files it depends on (:func:`command_files`): the files it names, the project modules a named
  Python script imports (an AST walk, nothing imported) and ``files``; they are the job's inputs,
  so editing them trains again;
* pinning (:func:`repository_state`, :func:`pin_problems`): the code must be a commit of its git
  repository: no modified tracked file, no untracked file next to a file the command uses, every
  such file committed; the commit a run was planned at is kept in the environment
  (:func:`pin_commit`) so that every job of that run checks it still has it;
* running it with its output streamed line by line to the job's log (:func:`run_streamed`);
* collecting the checkpoints it wrote into the run's layout (:func:`collect_checkpoints`), and the
  resume folders kept across attempts (:func:`prepare_attempt`);
* the training-subset contract: a command with ``{subset}`` trains on the positions of ``{data}``'s
  x_train that an ``.npy`` file lists (:func:`write_subset`): every non-holdout position for the
  run's own training (:func:`training_positions`), a random subset for each LDS retraining
  (:mod:`epochlens.study.retrain_command`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import string
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from epochlens.atomic import link_or_copy, save_npy
from epochlens.errors import EpochlensError
from epochlens.formats.factory import FactoryError, _module_files, _project_imports

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
#: A token with one of these suffixes names a file the command reads: it must exist.
SOURCE_SUFFIXES = (".py", ".json", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh")
#: Environment variable holding {repository root: commit} of the runs planned by this Snakemake.
PINNED_ENV = "EPOCHLENS_PINNED_COMMITS"
#: Lines of the command's output kept for an error message.
TAIL_LINES = 30


class CommandError(EpochlensError):
    """A training command that cannot be planned, pinned or run, or whose checkpoints are missing."""


# ---------------------------------------------------------------------------------------------
# The spec and its template


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


# ---------------------------------------------------------------------------------------------
# The files a command depends on


def named_files(
    spec: CommandSpec, index: int, seed: int, workdir: str | Path = ".", within: Iterable[str | Path] = ()
) -> list[Path]:
    """The files that the command line names (relative to ``workdir`` or absolute), with ``{index}``
    and ``{seed}`` filled in, and the module of ``python -m module`` (from ``workdir``). Only files
    under ``workdir`` or a folder of ``within`` (the repository) count, and no program binary: the
    interpreter and system tools are not inputs.

    A word with a source or config suffix (:data:`SOURCE_SUFFIXES`) that names no file is an error:
    the command would fail on it (write outputs into ``{output}`` instead).
    """
    workdir = Path(workdir).resolve()
    folders = [workdir, *(Path(f).resolve() for f in within)]
    later = set(PLACEHOLDERS) - set(PLAN_PLACEHOLDERS)  # known when the job runs
    line = fill_command(spec.command, {"index": index, "seed": seed}, keep=later)
    try:
        words = shlex.split(line, comments=True)
    except ValueError as exc:
        raise CommandError(f"{spec.key}.command: cannot split {spec.command!r} into words ({exc}).") from None
    found: list[Path] = []
    missing: list[str] = []
    for position, word in enumerate(words):
        if position and words[position - 1] == "-m" and re.fullmatch(r"[\w.]+", word):
            found += _module_files(word, workdir) or []
            continue
        candidate = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word  # --x=path
        if not candidate or "{" in candidate:
            continue
        path = Path(candidate).expanduser()
        path = (path if path.is_absolute() else workdir / path).resolve()
        if path.is_file():
            if any(path.is_relative_to(f) for f in folders) and not _is_binary(path):
                found.append(path)
        elif Path(candidate).suffix in SOURCE_SUFFIXES:
            missing.append(candidate)
    if missing:
        raise CommandError(
            f"{spec.key}.command names {missing}, which do(es) not exist (relative to {workdir}, "
            "where the command runs). Create and commit the file(s), or correct the command; a "
            "file the command writes belongs in its {output} folder."
        )
    return list(dict.fromkeys(found))


def _is_binary(path: Path) -> bool:
    """A compiled program (ELF, Mach-O): an interpreter or tool, not the user's code."""
    with open(path, "rb") as f:
        magic = f.read(4)
    return magic == b"\x7fELF" or magic in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


def script_imports(scripts: Iterable[Path], roots: Iterable[Path]) -> list[Path]:
    """The project modules that the Python ``scripts`` import, directly or indirectly: modules
    found under a script's own folder (Python's ``sys.path[0]``) or one of ``roots``. Nothing is
    imported; imports of installed packages are not followed, nor dynamic imports."""
    found: set[Path] = set()
    for script in scripts:
        for root in dict.fromkeys([script.parent.resolve(), *(Path(r).resolve() for r in roots)]):
            todo = [script.resolve()]
            seen = {script.resolve()}
            while todo:
                path = todo.pop()
                stat = path.stat()
                try:
                    deps = _project_imports(path, root, stat.st_mtime_ns, stat.st_size)
                except FactoryError as exc:
                    raise CommandError(str(exc).replace("model's source", "training script")) from None
                for dep in deps:
                    if dep not in seen:
                        seen.add(dep)
                        found.add(dep.resolve())
                        todo.append(dep)
    return sorted(found)


def command_files(
    spec: CommandSpec,
    index: int,
    seed: int,
    workdir: str | Path = ".",
    roots: Iterable[str | Path] = (),
    within: Iterable[str | Path] = (),
) -> list[Path]:
    """Every file the command depends on: those it names (:func:`named_files`; under ``workdir``
    or ``within``, the repository), the project modules its Python scripts import
    (:func:`script_imports`, from their folder and ``roots``, e.g. ``model.project_path``) and
    ``files``; absolute, sorted. A file of ``files`` that does not exist is an error naming the
    key."""
    workdir = Path(workdir).resolve()
    named = named_files(spec, index, seed, workdir, within)
    listed = []
    for name in spec.files:
        name = fill_plain(name, index, seed, f"{spec.key}.files")
        path = Path(name).expanduser()
        path = path if path.is_absolute() else workdir / path
        if not path.is_file():
            raise CommandError(
                f"{spec.key}.files: {name} does not exist (relative to {workdir}); correct the path "
                "or create and commit the file."
            )
        listed.append(path.resolve())
    scripts = [p for p in [*named, *listed] if p.suffix == ".py"]
    imported = script_imports(scripts, [workdir / r for r in roots])
    return sorted(set(named) | set(listed) | set(imported))


# ---------------------------------------------------------------------------------------------
# Pinning: the code is a commit of its git repository


def _git(root: Path, *args: str, check: bool = True) -> str:
    try:
        proc = subprocess.run(
            ["git", "-c", "core.quotePath=false", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        raise CommandError(
            "git is not installed (or not on PATH): the training command is pinned to a commit of "
            "its git repository. Install git, or set checkpoints.allow_dirty: true to run unpinned."
        ) from None
    if check and proc.returncode != 0:
        raise CommandError(f"git -C {root} {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class RepoState:
    """What git says about the repository of a training command and the files it uses.

    Attributes:
        root: the repository's top folder (None: not a git repository).
        commit: ``git rev-parse HEAD`` (None: not a repository, or no commit yet).
        modified: tracked files with changes (staged or not), relative to ``root``.
        untracked: untracked, not ignored files in the folders of the files the command uses.
        uncommitted: files the command uses that the commit does not have (not ignored ones).
        unpinned: files the command uses that are outside the repository or ignored by git.
    """

    root: Path | None
    commit: str | None
    modified: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)
    uncommitted: list[str] = field(default_factory=list)
    unpinned: list[str] = field(default_factory=list)

    @property
    def dirty(self) -> bool:
        return bool(
            self.root is None or self.commit is None or self.modified or self.untracked or self.uncommitted
        )

    def record(self) -> dict[str, Any]:
        """The provenance of a job: repository, commit and what was not committed."""
        return {
            "repository": str(self.root) if self.root else None,
            "commit": self.commit,
            "dirty": self.dirty,
            "modified": self.modified,
            "untracked": self.untracked,
            "uncommitted": self.uncommitted,
            "unpinned": self.unpinned,
        }


def repository_root(spec: CommandSpec, workdir: str | Path = ".") -> Path | None:
    """The top folder of the git repository of ``spec.repository`` (default: ``workdir``); None
    when it is not inside one. A ``repository`` that does not exist is an error."""
    folder = Path(workdir) / (spec.repository or ".")
    if not folder.is_dir():
        raise CommandError(
            f"{spec.key}.repository: {folder} is not a folder; name the folder of your code's git "
            "repository (relative to the working directory), or leave it out for the working "
            "directory's repository."
        )
    try:
        proc = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        return None
    return Path(proc.stdout.strip()).resolve() if proc.returncode == 0 else None


def repository_state(root: Path | None, files: Sequence[Path]) -> RepoState:
    """The state of the repository at ``root`` with respect to the command's ``files``."""
    if root is None:
        return RepoState(None, None, unpinned=[str(p) for p in files])
    head = _git(root, "rev-parse", "--verify", "-q", "HEAD", check=False).strip()
    state = RepoState(root, head or None)
    state.modified = _modified(root)
    inside = []
    for path in files:
        try:
            inside.append(Path(path).resolve().relative_to(root).as_posix())
        except ValueError:
            state.unpinned.append(str(path))
    if not inside:
        return state
    at_head = set()
    if state.commit:
        at_head = set(_git(root, "ls-tree", "-r", "-z", "--name-only", "HEAD", "--", *inside).split("\0"))
    missing = [f for f in inside if f not in at_head]
    ignored = set()
    if missing:
        ignored = set(_git(root, "check-ignore", "--no-index", "--", *missing, check=False).splitlines())
    state.uncommitted = [f for f in missing if f not in ignored]
    state.unpinned += [f for f in missing if f in ignored]
    untracked = set()
    for folder in sorted({str(Path(f).parent) for f in inside if f not in ignored}):
        prefix = "" if folder == "." else folder + "/"
        others = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--directory", "--", folder)
        untracked |= {
            name
            for name in others.split("\0")
            if name and not name.endswith("/") and "/" not in name[len(prefix) :]
        }
    state.untracked = sorted(untracked - set(state.uncommitted))
    return state


def _modified(root: Path) -> list[str]:
    """Tracked files with changes, staged or not (``git status``), relative to ``root``."""
    entries = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=no").split("\0")
    modified = []
    k = 0
    while k < len(entries):
        entry = entries[k]
        k += 1
        if len(entry) < 4:
            continue
        modified.append(entry[3:])
        if entry[0] in "RC":  # a rename or copy: the next entry is the old name
            k += 1
    return modified


def pin_problems(state: RepoState, allow_dirty: bool = False) -> list[str]:
    """What keeps the command from running at a commit, one line each (none with ``allow_dirty``)."""
    if allow_dirty:
        return []
    if state.root is None:
        return ["the code is not in a git repository (git rev-parse found none)"]
    if state.commit is None:
        return [f"the repository {state.root} has no commit yet"]
    lines = [f"modified: {f}" for f in state.modified]
    lines += [f"not committed: {f} (the command uses it)" for f in state.uncommitted]
    lines += [f"untracked: {f} (next to a file the command uses)" for f in state.untracked]
    return lines


def pin_error(spec: CommandSpec, state: RepoState, problems: Sequence[str], where: str = "") -> str:
    """The error for ``problems`` (:func:`pin_problems`): what, and the fixes."""
    shown = list(problems[:20]) + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
    lines = [
        f"{spec.key}: the training command runs from a commit of its git repository, so that every "
        f"replicate trains the same code{where}; but"
    ]
    lines += [f"  {p}" for p in shown]
    if state.root is None:
        lines.append(
            f"Fix: put the code under git (git init && git add ... && git commit), or name its "
            f"repository with {spec.key}.repository."
        )
    else:
        git = f"git -C {state.root}"
        lines.append(
            f"Fix: commit the changes ({git} add <files> && {git} commit) or undo them ({git} status "
            "shows them); ignore files that are neither code nor configs (.gitignore). Files the "
            "command writes belong in its {output} folder."
        )
    lines.append(
        f"To train from the tree as it is (recorded as dirty in train_metadata.json), set "
        f"{spec.key}.allow_dirty: true."
    )
    return "\n".join(lines)


def will_run(outputs: Iterable[str | Path], files: Iterable[str | Path], state: RepoState) -> bool:
    """Whether a command's job has to run as far as its files tell: one of its ``outputs`` is
    missing, or one of its input ``files`` has changes that are not committed (then it is newer
    than the outputs). The job checks the repository again when it starts, whatever this says."""
    if any(not Path(p).exists() for p in outputs):
        return True
    if state.root is None:
        return False
    changed = {(state.root / f).resolve() for f in [*state.modified, *state.uncommitted]}
    return any(Path(f).resolve() in changed for f in files)


def pinned_commits() -> dict[str, str]:
    """{repository root: commit} that this Snakemake run was planned at (:func:`pin_commit`)."""
    try:
        pins = json.loads(os.environ.get(PINNED_ENV, "{}"))
    except ValueError:
        return {}
    return pins if isinstance(pins, dict) else {}


def pin_commit(state: RepoState) -> str | None:
    """Keep the commit of ``state``'s repository in the environment (inherited by the jobs, on a
    cluster too), unless one is kept already: the commit the run was planned at. Returns that."""
    if state.root is None or state.commit is None:
        return None
    pins = pinned_commits()
    pins.setdefault(str(state.root), state.commit)
    os.environ[PINNED_ENV] = json.dumps(pins, sort_keys=True)
    return pins[str(state.root)]


def moved_error(spec: CommandSpec, state: RepoState, planned: str) -> str | None:
    """The error when the repository's HEAD is no longer the commit the run was planned at."""
    if state.commit is None or state.commit == planned:
        return None
    return (
        f"{spec.key}: the repository {state.root} is at commit {state.commit[:12]}, but this "
        f"Snakemake run was planned at {planned[:12]}: the replicates of a run train one commit, "
        "and the repository moved (a checkout, commit or pull) after the run was planned. Start "
        "snakemake again to plan at the new commit (finished trainings stay: the commit alone "
        f"retrains nothing), or check out {planned[:12]} again."
    )


def job_repository_state(spec: CommandSpec, files: Sequence[str | Path]) -> RepoState:
    """The pin check of a job that runs the command, as it starts: the code must still be the
    commit this Snakemake run was planned at, with nothing uncommitted (unless ``allow_dirty``);
    raises CommandError with the fix. Returns the repository's state (for the provenance)."""
    state = repository_state(repository_root(spec), [Path(f) for f in files])
    problems = pin_problems(state, spec.allow_dirty)
    if problems:
        raise CommandError(pin_error(spec, state, problems, " (checked as the job started)"))
    planned = pinned_commits().get(str(state.root))
    moved = None if spec.allow_dirty or planned is None else moved_error(spec, state, planned)
    if moved:
        raise CommandError(moved)
    return state


# ---------------------------------------------------------------------------------------------
# Running the command


@dataclass
class CommandResult:
    """How a command ended: exit status (negative: killed by that signal), seconds, the last lines
    of its output."""

    returncode: int
    seconds: float
    tail: list[str]

    @property
    def status(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"was killed by {name}"
        return f"exited with status {self.returncode}"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the command gets SIGKILL when the job's process dies (a job killed alone must not
    leave a training running beside its retry)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_streamed(
    command: str,
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
    tail: int = TAIL_LINES,
    redraw_every: float = 10.0,
) -> CommandResult:
    """Run ``command`` in a shell (bash where there is one) and copy its output (stdout and stderr
    merged) to ``stream`` line by line as it comes, so that ``tail -f`` on the job's log follows
    it. A carriage-return redraw (a progress bar) is copied at most every ``redraw_every`` seconds.

    ``env`` adds to the environment (PYTHONUNBUFFERED=1 is set, so Python scripts print at once).
    """
    stream = stream if stream is not None else sys.stderr
    shell = shutil.which("bash") or "/bin/sh"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    start = time.monotonic()
    last: deque[str] = deque(maxlen=tail)
    proc = subprocess.Popen(
        [shell, "-c", command],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    assert proc.stdout is not None
    pending = b""
    last_redraw = float("-inf")

    def emit(raw: bytes) -> None:
        text = raw.decode(errors="replace").rstrip()
        last.append(text if len(text) <= 500 else text[:500] + " ...")
        stream.write(text + "\n")
        stream.flush()

    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            pending += chunk
            while True:
                match = re.search(rb"[\r\n]", pending)
                if match is None:
                    break
                end = match.start()
                piece, sep = pending[:end], pending[end : end + 1]
                pending = pending[end + 1 :]
                if sep == b"\r":
                    if pending.startswith(b"\n"):  # \r\n: an ordinary line end
                        pending = pending[1:]
                    elif not piece.strip() or time.monotonic() - last_redraw < redraw_every:
                        continue
                    else:
                        last_redraw = time.monotonic()
                if piece.strip() or sep == b"\n":
                    emit(piece)
        if pending:
            emit(pending)
    finally:
        proc.stdout.close()
        returncode = proc.wait()
    return CommandResult(returncode, time.monotonic() - start, list(last))


def failure_message(
    spec: CommandSpec,
    index: int,
    command: str,
    result: CommandResult,
    log: str | None,
    resume: str,
    what: str | None = None,
) -> str:
    """The error of a command that did not exit 0: status, command, the tail of its output
    (``what`` names the run of it, default ``index {index}``)."""
    lines = [
        f"{spec.key}.command ({what or f'index {index}'}) {result.status} after {result.seconds:.1f} s:",
        f"  {command}",
        f"Its last {len(result.tail)} line(s) of output" + (f" (all of it: {log}):" if log else ":"),
    ]
    lines += [f"  | {line}" for line in result.tail] or ["  (no output)"]
    lines.append(
        f"The resume folder {resume} is kept: the next attempt (the profile's retries, or snakemake "
        "run again) continues from what the command saved there. Fix the command or the script, "
        "commit, and run snakemake again."
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Attempts and checkpoints


def fingerprint(obj: Any) -> str:
    """SHA-256 of ``obj`` as canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def file_digests(paths: Iterable[str | Path], root: str | Path | None = None) -> dict[str, str]:
    """{path (relative to ``root`` where inside it): sha256} of files."""
    digests = {}
    for path in paths:
        path = Path(path)
        name = str(path)
        if root is not None:
            with contextlib.suppress(ValueError):
                name = path.resolve().relative_to(Path(root).resolve()).as_posix()
        digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def prepare_attempt(state_file: str | Path, folders: Sequence[str | Path], key: str) -> bool:
    """Start an attempt of a job whose ``folders`` (``{output}``, ``{resume}``) survive failed
    attempts: keep them when ``state_file`` says they were made for ``key`` (the same command,
    files and data), else empty them and record ``key``. Returns whether they were kept."""
    state_file = Path(state_file)
    try:
        kept = json.loads(state_file.read_text()).get("key") == key
    except (OSError, ValueError, AttributeError):
        kept = False
    if not kept:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    for folder in folders:
        Path(folder).mkdir(parents=True, exist_ok=True)
    if not kept:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_file.with_name(f".{state_file.name}.tmp")
        tmp.write_text(json.dumps({"key": key}) + "\n")
        os.replace(tmp, state_file)
    return kept


def training_positions(holdout: Sequence[bool]) -> np.ndarray:
    """``{subset}`` of the run's own training: every position of ``{data}``'s x_train that the
    holdout does not hold out, int64, ascending (so a script that trains on ``x_train[subset]``
    trains on the same samples, in the same order, as one that drops the holdout)."""
    return np.flatnonzero(~np.asarray(holdout, dtype=bool)).astype(np.int64)


def write_subset(path: str | Path, positions: Sequence[int]) -> Path:
    """Write a ``{subset}`` file: int64 positions in ``{data}``'s x_train, one dimension,
    atomically; returns its absolute path."""

    save_npy(path, np.asarray(positions, dtype=np.int64).reshape(-1))
    return Path(path).resolve()


def collect_checkpoints(
    spec: CommandSpec, index: int, output: str | Path, destinations: Mapping[int, str | Path]
) -> dict[int, Path]:
    """Put the checkpoint the command wrote for each epoch (``spec.path`` under ``output``) at its
    destination (the run's layout), each atomically: a hard link, so the files stay in ``output``
    until the job has finished. Every checkpoint missing is an error naming it, the template and
    what the folder holds. Returns {epoch: destination}."""
    expected = written_checkpoints(spec, index, output, destinations)
    for epoch, src in expected.items():
        link_or_copy(src, Path(destinations[epoch]))
    return {e: Path(destinations[e]) for e in expected}


def written_checkpoints(
    spec: CommandSpec, index: int, output: str | Path, epochs: Iterable[int], what: str | None = None
) -> dict[int, Path]:
    """{epoch: the file the command wrote for it under ``output``} for each of ``epochs``; every
    one missing is an error naming it, the template and what the folder holds (``what`` names the
    run of the command, default ``index {index}``)."""
    output = Path(output)
    expected = {int(e): output / spec.checkpoint_name(index, e) for e in epochs}
    missing = {e: p for e, p in expected.items() if not p.is_file()}
    if missing:
        present = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
        listed = ", ".join(present[:20]) + (f", ... ({len(present)} files)" if len(present) > 20 else "")
        raise CommandError(
            f"{spec.key}.command ({what or f'index {index}'}) exited 0 but did not write "
            f"{len(missing)} of the {len(expected)} checkpoints that runs.{spec.run}.epochs lists: "
            + ", ".join(f"{p.relative_to(output)} (epoch {e})" for e, p in sorted(missing.items()))
            + f".\nIts output folder {output} holds: {listed or 'nothing'}.\n"
            f"Fix: make the command save the checkpoint of each epoch in {sorted(expected)} as "
            f"{{output}}/{spec.path} ({spec.key}.path, relative to the folder passed as {{output}}), "
            f"or correct {spec.key}.path or runs.{spec.run}.epochs."
        )
    return expected


def keep_other_files(output: str | Path, exclude: Iterable[str | Path], dest: str | Path) -> list[str]:
    """Put what else the command wrote into ``output`` (metrics, logs) under ``dest``, each file
    atomically (a hard link, as :func:`collect_checkpoints`); return the names (relative to
    ``output``)."""
    output, dest = Path(output), Path(dest)
    skip = {Path(p).resolve() for p in exclude}
    kept = []
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(output.rglob("*")):
        if path.is_file() and path.resolve() not in skip:
            rel = path.relative_to(output)
            link_or_copy(path, dest / rel)
            kept.append(rel.as_posix())
    return kept
