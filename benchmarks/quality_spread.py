"""Benchmark: the spread of every quality the tests assert (tests marked ``quality``: an accuracy, an
AUROC, an LDS, a ρ learned or sampled inside the tests), over seeds, threads and CPU kernels.

Each configuration runs ``pytest -m quality`` as ``make test`` does (``-n 2 --dist loadfile``)
with ``EPOCHLENS_TEST_SEED`` (the seeds of the runs the tests train or draw, tests/quality.py),
the workers' threads (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``) and the
kernels: ``native`` (what the CPU offers) or ``avx2`` (``ATEN_CPU_CAPABILITY``,
``MKL_ENABLE_INSTRUCTIONS`` and ``ONEDNN_MAX_CPU_ISA`` capped at AVX2: another machine's kernels
on this one). With ``EPOCHLENS_QUALITY_LOG`` set each check records its value instead of
asserting, so one run measures every check. The table: per check, the worst and mean value over
the configurations, their standard deviation, the threshold, and the margin (worst minus
threshold, in standard deviations, toward the passing side).

    .venv/bin/python benchmarks/quality_spread.py --seeds 0 1 2 --threads 1 2 --kernels native avx2 \
        --out /tmp/quality.jsonl [-- tests/unit]       # pytest arguments after --

Configurations already in ``--out`` are skipped (a long measurement resumes); ``--table-only``
prints the table of ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from quality import OPS  # noqa: E402  (the checks' own comparisons)

KERNELS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="threads per pytest worker")
    p.add_argument("--kernels", nargs="+", choices=sorted(KERNELS), default=["native"])
    p.add_argument("--workers", type=int, default=2, help="pytest -n")
    p.add_argument("--out", type=Path, required=True, help="JSON lines: every check of every configuration")
    p.add_argument("--more", type=Path, nargs="*", default=[], help="other measurements for the table")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--markdown", action="store_true", help="the table as Markdown (docs/development.md)")
    p.add_argument("pytest_args", nargs="*", help="after --: what to run (default: every quality test)")
    return p


def measure(seed: int, threads: int, kernels: str, workers: int, pytest_args: list[str], out: Path) -> None:
    """One configuration: pytest -m quality, its checks appended to ``out`` with the configuration."""
    env = {**os.environ, "EPOCHLENS_TEST_SEED": str(seed), **KERNELS[kernels]}
    env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "checks.jsonl"
        env["EPOCHLENS_QUALITY_LOG"] = str(log)
        cmd = [sys.executable, "-m", "pytest", "-m", "quality", "-p", "no:cacheprovider", "-q"]
        cmd += ["-n", str(workers), "--dist", "loadfile", *pytest_args]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        tail = proc.stdout.strip().splitlines()[-1:] or [""]
        print(f"seed {seed}, {threads} threads, {kernels}: {tail[0]} ({seconds:.0f} s)", file=sys.stderr)
        if proc.returncode not in (0, 1):  # 1: a test failed outside the recorded checks
            raise SystemExit(f"pytest exited {proc.returncode}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    with out.open("a") as f:
        for row in rows:
            f.write(json.dumps({**row, "threads": threads, "kernels": kernels}) + "\n")
        f.write(json.dumps({"configuration": [seed, threads, kernels], "failed": failed}) + "\n")


def done(out: Path) -> set[tuple]:
    if not out.exists():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {tuple(r["configuration"]) for r in rows if "configuration" in r}


def table(*outs: Path) -> pd.DataFrame:
    """Per check (over the measurements of ``outs``): seeds and configurations measured, the worst
    and mean of its values, the sd over seeds (each seed's mean once), the spread a machine adds
    (the largest range over threads and kernels at one seed), the threshold and the margin (worst
    to threshold, in sd)."""
    rows = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    checks = pd.DataFrame([r for r in rows if "check" in r])
    # a configuration measured again (a resumed or repeated measurement): its last values
    checks = checks.drop_duplicates(["test", "check", "seed", "threads", "kernels"], keep="last")
    result = []
    for (test, check), g in checks.groupby(["test", "check"], sort=False):
        op, threshold = g["op"].iloc[-1], float(g["threshold"].iloc[-1])  # the test's threshold now
        upward = op in (">", ">=")  # passing side: above the threshold
        values = g["value"].to_numpy(float)
        worst = np.nanmin(values) if upward else np.nanmax(values)
        per_seed = g.groupby("seed")["value"].mean().to_numpy(float)  # each draw once
        sd = float(np.nanstd(per_seed, ddof=1)) if len(per_seed) > 1 else float("nan")
        gap = (worst - threshold) if upward else (threshold - worst)
        machine = g.groupby("seed")["value"].agg(lambda v: v.max() - v.min()).max()
        result.append({
            "test": test.split("::", 1)[-1], "check": check, "seeds": g["seed"].nunique(),
            "configs": len(g.groupby(["threads", "kernels"])), "worst": worst,
            "mean": float(np.nanmean(per_seed)), "sd": sd, "machine": machine, "op": op,
            "threshold": threshold,
            "margin_sd": gap / sd if sd > 0 else float("inf") if gap > 0 else float("nan"),
            "failed": int((~OPS[op](values, threshold)).sum()),  # at today's threshold
        })  # fmt: skip
    return pd.DataFrame(result)


def main(argv: list[str] | None = None) -> int:
    args = options().parse_args(argv)
    if not args.table_only:
        todo = itertools.product(args.seeds, args.threads, args.kernels)
        for config in [c for c in todo if c not in done(args.out)]:
            measure(*config, args.workers, args.pytest_args, args.out)
    result = table(args.out, *args.more)
    with pd.option_context("display.width", 250, "display.max_colwidth", 70, "display.max_rows", 500):
        print(result.to_markdown(index=False, floatfmt=".4g") if args.markdown else result.to_string())
    failures = [json.loads(line) for out in (args.out, *args.more) for line in out.read_text().splitlines()]
    for row in failures:
        if row.get("failed"):
            print(f"{row['configuration']}: {row['failed']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
