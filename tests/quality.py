"""Checks of a learned or sampled quality (an accuracy, an AUROC, an LDS, a ρ) measured on a run
trained or drawn inside the tests. Such a number depends on the seeds, the threads and the CPU's
kernels, so each threshold is set from a measured spread (docs/development.md, "Quality
assertions"), not guessed: ``benchmarks/quality_spread.py`` runs the tests marked ``quality`` with
other seeds, thread counts and kernels and tabulates what these checks saw.

Two environment variables serve that measurement and change nothing otherwise:

- ``EPOCHLENS_TEST_SEED`` (default 0): added to the seeds of the runs these tests train or draw;
- ``EPOCHLENS_QUALITY_LOG``: a JSON-lines file where every check appends its name, value and
  threshold; a value on the wrong side is then recorded (``"passed": false``) instead of raised,
  so that one pass measures every check of a test.
"""

from __future__ import annotations

import json
import operator
import os

#: Added to the seeds of the runs trained or drawn in the quality tests (0: the suite's runs).
SEED = int(os.environ.get("EPOCHLENS_TEST_SEED", "0"))


def at_least(name: str, value: float, threshold: float, detail: object = "") -> None:
    """Assert ``value >= threshold`` (``name``: what is measured, unique within its test)."""
    _check(name, value, threshold, ">=", detail)


def above(name: str, value: float, threshold: float, detail: object = "") -> None:
    """Assert ``value > threshold``."""
    _check(name, value, threshold, ">", detail)


def at_most(name: str, value: float, threshold: float, detail: object = "") -> None:
    """Assert ``value <= threshold``."""
    _check(name, value, threshold, "<=", detail)


def below(name: str, value: float, threshold: float, detail: object = "") -> None:
    """Assert ``value < threshold``."""
    _check(name, value, threshold, "<", detail)


#: The comparisons, by the operator a failure prints.
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def _check(name: str, value: float, threshold: float, op: str, detail: object) -> None:
    value = float(value)
    passed = OPS[op](value, threshold)
    log = os.environ.get("EPOCHLENS_QUALITY_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        row = {"test": test, "check": name, "value": value, "op": op, "threshold": threshold}
        with open(log, "a") as f:
            f.write(json.dumps({**row, "passed": passed, "seed": SEED}) + "\n")
        return
    assert passed, (
        f"{name}: {value:.4g} is not {op} {threshold:.4g} (measured spread: docs/development.md)\n{detail}"
    )
