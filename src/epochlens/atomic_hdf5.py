"""HDF5 files written atomically (:func:`epochlens.atomic.atomic_path`), and safely on a full disk.

Apart from :mod:`epochlens.atomic` because it needs h5py, which the figure rules' environment
(envs/plots.yaml) does not have: every script imports ``epochlens.atomic``; only those that
write HDF5 import this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from epochlens.atomic import atomic_path


@contextmanager
def atomic_h5(path: str | os.PathLike) -> Iterator[Any]:
    """An ``h5py.File`` open for writing, renamed to ``path`` once closed (:func:`atomic_path`).

    HDF5 crashes the process (a segmentation fault, no message, its temporary file left behind)
    when it closes a file whose write failed, as on a full disk; so it writes through
    :class:`_WriteGuard`, which keeps the first failed write's error, lets HDF5 close, and raises
    it then."""
    import h5py

    with atomic_path(path) as tmp:
        guard = _WriteGuard(open(tmp, "w+b"))  # noqa: SIM115 - closed by the guard
        try:
            with h5py.File(guard, "w") as f:
                yield f
        except Exception:
            if guard.error is None:
                raise
        finally:
            guard.close()
        if guard.error is not None:  # what HDF5 then reports is a consequence of it
            raise guard.error


class _WriteGuard:
    """A file for h5py: writes until one fails, then takes the later ones without writing them
    (the file is deleted anyway) and keeps the first error in ``error``."""

    def __init__(self, file) -> None:
        self._file, self.error = file, None

    def write(self, data) -> int:
        if self.error is None:
            try:
                self._file.write(data)
            except OSError as exc:
                self.error = exc
        return len(memoryview(data))

    def flush(self) -> None:
        self._guarded(self._file.flush)

    def truncate(self, size: int | None = None) -> int:
        return self._guarded(lambda: self._file.truncate(size)) or 0

    def close(self) -> None:
        self._guarded(self._file.close)
        if not self._file.closed:  # its buffer could not be written: drop it
            os.close(self._file.fileno())

    def _guarded(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except OSError as exc:
            self.error = self.error or exc
            return None

    def __getattr__(self, name: str) -> Any:  # read, readinto, seek, tell, ...
        return getattr(self._file, name)
