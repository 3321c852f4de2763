"""What a bad input led to (``benchmarks/faults.py --inputs``): a case, its outcome, and the
table of outcomes per family."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from epochlens.errors import EpochlensError  # noqa: E402

SCHEMA = REPO / "config" / "schema.yaml"
RUN = "tiny"
OUTCOMES = ("clear", "unnamed", "traceback", "silent")
MISSING = "/nonexistent/faults"


@dataclass
class Case:
    """One bad input: ``family`` (its table), ``name``, what the message must name (any of
    ``names``), and ``check``: a function that raises as the pipeline would, or returns normally
    when nothing refuses the input (a dry run's output when it is one)."""

    family: str
    name: str
    names: tuple[str, ...]
    check: Callable[[], str | None]
    dry_run: Callable[[], subprocess.CompletedProcess] | None = None


@dataclass
class Outcome:
    case: Case
    kind: str
    message: str = field(repr=False, default="")


# ---------------------------------------------------------------------------------------------
# Classifying


PY_ERRORS = (
    ("KeyError", "TypeError", "AttributeError", "IndexError", "ValueError", "ZeroDivisionError")
    + ("RuntimeError", "AssertionError", "NameError", "OSError", "FileNotFoundError")
    + ("UnpicklingError", "EOFError")
)


def classify(case: Case) -> Outcome:
    """Run ``case`` and sort its outcome (module doc)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # transformers' load reports
            case.check()
    except EpochlensError as exc:
        message = str(exc)
    except Exception:  # what a user reads when a job meets it: a traceback
        return Outcome(case, "traceback", traceback.format_exc(limit=4))
    else:
        if case.dry_run is None:
            return Outcome(case, "silent")
        return classify_dry_run(case, case.dry_run())
    return Outcome(case, "clear" if names_any(message, case.names) else "unnamed", message)


def classify_dry_run(case: Case, proc: subprocess.CompletedProcess) -> Outcome:
    """A dry run's outcome. An error raised while planning is framed by Snakemake (an
    InputFunctionException naming the rule, ``Error:``, the message, and the rule file's lines):
    the message is what counts, a traceback when it is a bare Python exception. A dry run that
    succeeds is silent unless it warned, naming the file (a missing checkpoint under --keep-going:
    its job then fails with the fix)."""
    out = proc.stdout + proc.stderr
    error = re.search(r"Error:\n\s+(\w+):", out)
    if "Traceback (most recent call last)" in out or (error and error.group(1) in PY_ERRORS):
        return Outcome(case, "traceback", out[-3000:])
    if proc.returncode == 0 and not names_any(out, case.names):
        return Outcome(case, "silent", out[-1500:])
    return Outcome(case, "clear" if names_any(out, case.names) else "unnamed", out[-3000:])


def names_any(message: str, names: tuple[str, ...]) -> bool:
    return any(n in message for n in names)


# ---------------------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    families = list(dict.fromkeys(o.case.family for o in outcomes))
    counts = Counter((o.case.family, o.kind) for o in outcomes)
    rows = [("inputs", "family", *OUTCOMES)]
    for family in [*families, "total"]:
        picked = [o for o in outcomes if family in ("total", o.case.family)]
        rows.append((str(len(picked)), family, *(str(sum(o.kind == k for o in picked)) for k in OUTCOMES)))
    del counts
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:-1], "-" * len(lines[0]), lines[-1]])
