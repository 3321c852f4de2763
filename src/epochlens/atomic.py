"""Atomic file writes: a result file either exists complete or not at all.

A job killed mid-write (time limit, pre-emption, Ctrl-C) must never leave a truncated file that a
later run mistakes for a finished one. Each writer writes to a temporary file in the destination's
folder and renames it into place (``os.replace`` is atomic on POSIX within one file system).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it to ``path``, else delete it."""
    path = Path(path)
    tmp_path = _temporary(path)
    try:
        yield tmp_path
        # mkstemp creates the file with mode 0600; give the result the mode a plain open() would
        # (0666 minus the umask), so collaborators on a shared file system can read the results.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _temporary(path: Path) -> Path:
    """A new empty file beside ``path``, named for it and this process (:func:`orphan_tag`), after
    deleting those that killed writers of ``path`` left (:func:`remove_orphans`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path.parent, f".{path.name}.")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{orphan_tag()}", suffix=".tmp")
    os.close(fd)
    return Path(tmp)


def orphan_tag() -> str:
    """Part of a temporary's name: this process's id, for :func:`remove_orphans`."""
    return f"pid{os.getpid()}-"


def remove_orphans(folder: Path, stem: str) -> None:
    """Delete the temporaries ``{stem}pid{N}-...`` in ``folder`` (files or folders) whose process N
    is gone: a writer killed (SIGKILL, a lost node) cannot delete its own. Those of running
    processes are kept."""
    pattern = re.compile(re.escape(stem) + r"pid(\d+)-")
    for orphan in folder.glob(glob.escape(stem) + "pid*"):
        m = pattern.match(orphan.name)
        if m and not _alive(int(m.group(1))):
            if orphan.is_dir():
                shutil.rmtree(orphan, ignore_errors=True)
            else:
                orphan.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, writer: Callable[[Path], Any]) -> None:
    """Call ``writer(tmp_path)`` and move the result to ``path`` atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically."""
    write_atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


def save_npy(path: str | Path, array: Any) -> None:
    """``np.save`` atomically (through a file handle, so no ``.npy`` suffix is appended)."""
    import numpy as np

    def _write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, array)

    write_atomic(path, _write)


def link_or_copy(src: str | Path, dest: str | Path) -> None:
    """Make ``dest`` the same file as ``src`` atomically: a hard link, or a copy where the file
    system does not support hard links (or ``src`` is on another one)."""
    src, dest = Path(src), Path(dest)
    tmp_path = _temporary(dest)  # not atomic_path: its chmod would change src's mode through the link
    try:
        tmp_path.unlink()
        try:
            os.link(src, tmp_path)
        except OSError:
            shutil.copyfile(src, tmp_path)
        os.replace(tmp_path, dest)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
