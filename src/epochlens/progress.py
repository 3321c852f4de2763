"""Progress of long loops that a person can follow in a terminal and in a cluster job's log file.

On a terminal, :func:`progress_bar` is an ordinary tqdm bar (redrawn in place with carriage returns).
Anywhere else — a log file, a SLURM job's output, the stderr that
:func:`epochlens.runner.run_step` copies to the job's log — a redrawn bar is useless (the log
keeps nothing, or one garbled line), so the bar writes plain lines instead: one each time the loop
passes another ``line_every`` of its total (5% by default; every update with ``line_every=0``, e.g.
one line per training epoch), at least one every ``max_silence`` seconds while it advances, and a
last one when it ends. Each line says where the loop is, its mean rate and the time left::

    2026-01-31 12:00:05 curvature: 2500/50000 samples (5%), 41.7 samples/s, elapsed 0:01:00, ETA 0:19:00
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from tqdm.auto import tqdm as _auto_tqdm
from tqdm.std import tqdm

__all__ = ["LineProgress", "progress_bar", "writes_plain_lines"]


def writes_plain_lines(stream: Any) -> bool:
    """Whether a bar on ``stream`` should write plain lines: not a terminal, not a notebook."""
    if type(stream).__module__.startswith("ipykernel"):  # Jupyter: tqdm.auto draws a widget
        return False
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return True


class LineProgress(tqdm):
    """A tqdm bar that writes one plain line per ``line_every`` of the total instead of redrawing.

    Takes tqdm's arguments plus:

    - ``line_every``: fraction of ``total`` between two lines (0.05: at 5%, 10%, ..., 100%; 0: a
      line at every update). Without a total, lines come from ``max_silence`` and the end only.
    - ``max_silence``: seconds; a line also when this long has passed since the last one and the
      loop has advanced (a slow 5% still shows the job is alive). None: never.
    - ``clock``: a function returning seconds (tests pass a fake clock; default ``time.time``).

    Rates and ETAs are overall means (work done / time since the start), not tqdm's smoothed
    recent rate: over a long job they are steadier and what a person estimating the wall time
    needs.
    """

    def __init__(
        self,
        *args: Any,
        line_every: float = 0.05,
        max_silence: float | None = 300.0,
        clock: Callable[[], float] | None = None,
        **kwargs: Any,
    ) -> None:
        # Every update reaches display(), which decides; a line costs only when one is due.
        kwargs.update(mininterval=0, miniters=1, delay=0)
        self._line_every = line_every
        self._max_silence = max_silence
        self._step_done = 0  # index of the last fraction step reported
        self._line_n: float | None = None  # n at the last line
        self._line_t = 0.0
        super().__init__(*args, **kwargs)
        if self.disable:  # tqdm set up nothing else
            return
        if clock is not None:
            self._time = clock
            self.start_t = self.last_print_t = clock()
        self._line_t = self.start_t

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Write a line when one is due (never redraws; ``msg``/``pos`` are tqdm's, ignored)."""
        if msg is not None or self.n == self._line_n or self.n <= self.initial:
            return False  # tqdm clearing the bar, nothing new, or nothing done yet
        if self._due():
            self._write_line()
        return True

    def close(self) -> None:
        """Write the last line (if the loop advanced since the previous one) and close."""
        if not self.disable and self.n != self._line_n and self.n > self.initial:
            self._write_line()
        self.leave = False  # tqdm's closing redraw would only print a blank line
        super().close()

    def _due(self) -> bool:
        if self.total and self.n >= self.total:
            return True
        if self.total:
            step = (
                int(self.n) if self._line_every == 0 else int(self.n / self.total / self._line_every + 1e-9)
            )
            if step > self._step_done:
                self._step_done = step
                return True
        return self._max_silence is not None and self._time() - self._line_t >= self._max_silence

    def _write_line(self) -> None:
        now = self._time()
        self._line_n, self._line_t = self.n, now
        self.fp.write(self.line(now) + "\n")
        getattr(self.fp, "flush", lambda: None)()

    def line(self, now: float | None = None) -> str:
        """The progress line for the current state (without a newline)."""
        now = self._time() if now is None else now
        elapsed = max(now - self.start_t, 0.0)
        done = self.n - self.initial
        unit = _plural(self.unit)
        where = f"{_num(self.n)}/{_num(self.total)} {unit}" if self.total else f"{_num(self.n)} {unit}"
        if self.total:
            where += f" ({100 * self.n / self.total:.0f}%)"
        parts = [where]
        rate = done / elapsed if elapsed > 0 and done > 0 else None
        if rate is None:
            parts.append(f"? {self.unit}/s")
        elif rate >= 1:
            parts.append(
                f"{rate:.0f} {_plural(self.unit)}/s" if rate >= 100 else f"{rate:.3g} {_plural(self.unit)}/s"
            )
        else:
            parts.append(f"{1 / rate:.3g} s/{self.unit}")
        parts.append(f"elapsed {_interval(elapsed)}")
        if self.total:
            left = (self.total - self.n) / rate if rate else None
            parts.append("ETA " + (_interval(left) if left is not None else "?"))
        if self.postfix:
            parts.append(str(self.postfix).lstrip(", "))
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        desc = f"{self.desc.rstrip(': ')}: " if self.desc else ""
        return f"{stamp} {desc}{', '.join(parts)}"


def _plural(unit: str) -> str:
    return unit if unit.endswith("s") or unit == "it" else unit + "s"


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:g}" if isinstance(x, float) and not x.is_integer() else str(int(x))


def _interval(seconds: float) -> str:
    """H:MM:SS (days as D-HH:MM:SS, as SLURM writes wall times)."""
    s = round(seconds)
    days, s = divmod(s, 86400)
    hms = f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{hms.zfill(8)}" if days else hms


def progress_bar(
    iterable: Iterable | None = None,
    *,
    file: TextIO | None = None,
    line_every: float = 0.05,
    max_silence: float | None = 300.0,
    **kwargs: Any,
) -> tqdm:
    """A progress bar over ``iterable`` (or updated by hand with ``total=``): tqdm's live bar on a
    terminal or notebook, :class:`LineProgress` plain lines elsewhere (log files, cluster jobs).

    Takes tqdm's keyword arguments (``total``, ``desc``, ``unit``, ``disable``, ``leave``, ...)
    and ``file`` (default: ``sys.stderr`` at the time of the call).
    """
    stream = sys.stderr if file is None else file
    if writes_plain_lines(stream):
        return LineProgress(iterable, file=stream, line_every=line_every, max_silence=max_silence, **kwargs)
    return _auto_tqdm(iterable, file=stream, **kwargs)
