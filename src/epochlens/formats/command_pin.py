"""Pinning a training command: its code must be a commit of its git repository (no modified tracked
file, no untracked file next to a file the command uses, every such file committed); the commit a
run was planned at is kept in the environment (:func:`pin_commit`) so that every job of that run
checks it still has it. Torch-free. See :mod:`epochlens.formats.command`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochlens.formats.command_spec import CommandError, CommandSpec

#: Environment variable holding {repository root: commit} of the runs planned by this Snakemake.
PINNED_ENV = "EPOCHLENS_PINNED_COMMITS"


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
