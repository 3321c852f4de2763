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
it that knows nothing of Snakemake, in four modules whose names this one re-exports:

* the command as a template (:mod:`.command_spec`): its placeholders (:data:`PLACEHOLDERS`), filled
  shell-quoted (:func:`fill_command`);
* the files it depends on (here: :func:`command_files`): the files it names, the project modules a
  named Python script imports (an AST walk, nothing imported) and ``files``; they are the job's inputs,
  so editing them trains again;
* pinning (:mod:`.command_pin`; :func:`repository_state`, :func:`pin_problems`): the code must be
  a commit of its git repository: no modified tracked file, no untracked file next to a file the
  command uses, every such file committed; the commit a run was planned at is kept in the environment
  (:func:`pin_commit`) so that every job of that run checks it still has it;
* running it (:mod:`.command_run`) with its output streamed line by line to the job's log
  (:func:`run_streamed`);
* collecting the checkpoints it wrote into the run's layout (:func:`collect_checkpoints`), and the
  resume folders kept across attempts (:func:`prepare_attempt`);
* the training-subset contract: a command with ``{subset}`` trains on the positions of ``{data}``'s
  x_train that an ``.npy`` file lists (:func:`write_subset`): every non-holdout position for the
  run's own training (:func:`training_positions`), a random subset for each LDS retraining
  (:mod:`epochlens.study.retrain_command`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from epochlens.formats.command_pin import (  # noqa: F401 (re-exported: one import path for every part)
    PINNED_ENV,
    RepoState,
    job_repository_state,
    moved_error,
    pin_commit,
    pin_error,
    pin_problems,
    pinned_commits,
    repository_root,
    repository_state,
    will_run,
)
from epochlens.formats.command_run import (  # noqa: F401 (re-exported: one import path for every part)
    TAIL_LINES,
    CommandResult,
    collect_checkpoints,
    failure_message,
    file_digests,
    fingerprint,
    keep_other_files,
    prepare_attempt,
    run_streamed,
    training_positions,
    write_subset,
    written_checkpoints,
)
from epochlens.formats.command_spec import (  # noqa: F401 (re-exported: one import path for every part)
    PLACEHOLDERS,
    PLAN_PLACEHOLDERS,
    CommandError,
    CommandSpec,
    command_params,
    fill_command,
    fill_plain,
    seed_of,
    template_fields,
)
from epochlens.formats.factory import FactoryError, _module_files, _project_imports

#: A token with one of these suffixes names a file the command reads: it must exist.
SOURCE_SUFFIXES = (".py", ".json", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh")


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
