"""Running a pipeline step with a log file and errors a user can act on.

The workflow's scripts call :func:`run_step`; it knows nothing of Snakemake, only a log path.
Everything written to stderr (messages, progress lines, tracebacks) goes to the terminal and to the
log. The copy is not a terminal, so the library's progress bars (:mod:`epochlens.progress`) write a
plain line per epoch or per 5% of a loop, with rate and ETA, that the log keeps.
A user error (:class:`~epochlens.errors.EpochlensError`) is reported as its message alone, without
a traceback, and the step exits with status 1 so the workflow manager marks it failed.

A step that used CUDA ends its process as soon as it has finished (outputs written, logs flushed),
without Python's interpreter teardown: on an H200 with PyTorch 2.11, 4 of 55 curvature jobs of the
demo finished their work and then aborted in that teardown ("terminate called without an active
exception", SIGABRT), and Snakemake deleted their finished outputs. ``EPOCHLENS_FULL_TEARDOWN=1``
restores the normal exit (e.g. for a coverage tool's exit handlers).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from epochlens.errors import EpochlensError

log = logging.getLogger("epochlens")


class _Tee:
    """Copy writes to the terminal and to the log file; carriage-return redraws (a tqdm bar from
    code that does not use :func:`epochlens.progress.progress_bar`) go to the terminal only."""

    def __init__(self, terminal, logfile):
        self.terminal, self.logfile = terminal, logfile

    def write(self, text: str) -> int:
        self.terminal.write(text)
        if not text.startswith("\r"):  # tqdm redraws a bar by writing "\r..."
            with contextlib.suppress(OSError):  # a full disk: the terminal still gets the error
                self.logfile.write(text)
        self.flush()
        return len(text)

    def flush(self) -> None:
        self.terminal.flush()
        with contextlib.suppress(OSError):
            self.logfile.flush()

    def isatty(self) -> bool:
        return False


def run_step(main: Callable[[], None], log_path: str | Path | None) -> None:
    """Call ``main()`` with stderr copied to ``log_path``; exit 1 with a clear message on error."""
    handle = None
    original = sys.stderr
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handle = open(log_path, "w")  # noqa: SIM115 - closed in finally
        sys.stderr = _Tee(original, handle)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    try:
        main()
    except EpochlensError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None
    except Exception as exc:
        if not _short_write(exc):
            traceback.print_exc()
        else:
            log.error("%s", disk_full_message(exc, Path(log_path or ".")))
        raise SystemExit(1) from None
    finally:
        sys.stderr = original
        if handle:
            with contextlib.suppress(OSError):
                handle.close()
    _end_cuda_process()


#: What a write cut short by a full file system raises: errno 28 (open, write, h5py), numpy's
#: "N requested and M written", PyTorch's zip writer "unexpected pos".
_SHORT_WRITE = re.compile(
    r"No space left on device|errno = 28|requested and \d+ written|unexpected pos \d+ vs"
)


def _short_write(exc: BaseException) -> bool:
    chain = [exc, exc.__cause__, exc.__context__]
    return any(
        e is not None and (getattr(e, "errno", None) == errno.ENOSPC or _SHORT_WRITE.search(str(e)))
        for e in chain
    )


def disk_full_message(exc: BaseException, near: Path) -> str:
    """The error of a step whose write a full file system cut short: the file system (of ``near``,
    the step's log) with its size and free space, and what to do. The step's outputs are written
    atomically, so nothing half-written is left."""
    folder = near.resolve().parent if not near.is_dir() else near.resolve()
    while not folder.exists():
        folder = folder.parent
    mount = folder
    while not os.path.ismount(mount):
        mount = mount.parent
    usage = shutil.disk_usage(folder)
    return (
        f"a write failed: the file system is full ({type(exc).__name__}: {str(exc)[:200]}). The file "
        f"system mounted at {mount} holds {usage.total / 2**20:.1f} MiB, {usage.free / 2**20:.1f} MiB "
        "free as the step failed (its partial outputs are removed: nothing half-written is kept). Free "
        "space there, or point the results at a larger file system, and run snakemake again: the "
        "finished results stay and only what is missing runs."
    )


def _end_cuda_process() -> None:
    """After a successful step that initialised CUDA: flush and leave without interpreter teardown
    (see the module doc). Does nothing on a CPU-only step."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized() or os.environ.get("EPOCHLENS_FULL_TEARDOWN"):
        return
    torch.cuda.synchronize()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
