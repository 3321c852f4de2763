"""Benchmark: peak memory of the light jobs (the table and figure rules) against a 200 MB target.

The light rules run on the submit host (local rules) next to the workflow; each should stay under
200 MB of peak RSS. Three measures:

* default: each light job's ``max_rss`` (MB) as Snakemake recorded it in
  ``results/*/benchmarks/<rule>.tsv`` during the last run (after ``snakemake --profile
  profiles/default``; rerun one rule with ``--forcerun <rule>``). Snakemake samples the job's
  processes (the shell and the script) once a second, so it may miss a short peak;
* ``--exact``: reruns the light jobs of the finished run in the working directory
  (``snakemake --profile profiles/default --cores 1 --forcerun <light rules>``) with a
  ``sitecustomize`` module on ``PYTHONPATH`` that records each job script's own high-water mark
  (``VmHWM``, the kernel's peak RSS) as it exits: the exact peak of the script's process;
* ``--imports``: the peak RSS (MB) of a fresh Python process that only runs the import statements
  of each light rule's script (``ru_maxrss``), the floor under the job's peak.

Exits 1 when a job (or, with ``--imports``, a script's imports) is over ``--target``. Usage, from
the working directory of a finished demo run:

    .venv/bin/python benchmarks/light_jobs.py [--exact] [--imports] [--json]
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The table and figure rules (local rules, no torch) and the script each runs.
LIGHT_RULES = {
    "accuracy_tables": "accuracy_tables.py",
    "curvature_tables": "curvature_tables.py",
    "probe_tables": "probe_tables.py",
    "ablation_tables": "ablation_tables.py",
    "poison_detection": "poison_detection.py",
    "plot_training": "plot_training.py",
    "plot_accuracy": "plot_accuracy.py",
    "plot_curvature": "plot_curvature.py",
    "plot_probes": "plot_probes.py",
    "plot_ablation": "plot_ablation.py",
    "plot_influence": "plot_influence.py",
    "lds_tables": "lds_tables.py",
    "plot_lds": "plot_lds.py",
}

_PEAK = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def job_peaks(results: Path) -> list[dict]:
    """One row per light job that has a benchmark file: rule, run, max_rss (MB), seconds."""
    rows = []
    for rule in LIGHT_RULES:
        for tsv in sorted(results.glob(f"*/benchmarks/{rule}.tsv")):
            with tsv.open() as f:
                record = next(csv.DictReader(f, delimiter="\t"), None)
            if record is None:
                continue
            rss = record.get("max_rss", "NA")
            rows.append(
                {
                    "rule": rule,
                    "run": tsv.parts[-3],
                    "max_rss_mb": None if rss in ("NA", "", None) else float(rss),
                    "seconds": float(record["s"]),
                }
            )
    return rows


#: Appends "<script path>\t<run>\t<VmHWM kB>" to $LIGHT_JOBS_PEAKS when a process exits (--exact).
_SITECUSTOMIZE = """
import atexit, os, sys

def _record():
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    job = getattr(sys.modules["__main__"], "snakemake", None)  # the job's object (preamble)
    run = getattr(getattr(job, "wildcards", None), "run", "")
    with open(os.environ["LIGHT_JOBS_PEAKS"], "a") as f:
        f.write(f"{sys.argv[0]}\\t{run}\\t{hwm}\\n")

if os.environ.get("LIGHT_JOBS_PEAKS") and sys.argv and sys.argv[0].endswith(".py"):
    atexit.register(_record)
"""


def exact_peaks(workdir: Path, snakemake: str) -> list[dict]:
    """Rerun the light jobs of the run in ``workdir``; one row per job: rule, the script
    process's peak RSS (MB, VmHWM). Jobs run one at a time (``--cores 1``)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        peaks = Path(tmp) / "peaks.tsv"
        env = dict(
            os.environ,
            LIGHT_JOBS_PEAKS=str(peaks),
            PYTHONPATH=os.pathsep.join(filter(None, [tmp, str(REPO / "src"), os.getenv("PYTHONPATH")])),
        )
        cmd = [snakemake, "--profile", "profiles/default", "--cores", "1", "--forcerun", *LIGHT_RULES]
        subprocess.run(cmd, cwd=workdir, env=env, check=True, capture_output=True)
        rows = []
        for line in peaks.read_text().splitlines() if peaks.exists() else []:
            script, run, kib = line.split("\t")
            rule = Path(script).name.split(".")[-2]  # .snakemake/scripts/tmpXXXX.<script>.py
            if rule in LIGHT_RULES:
                rows.append({"rule": rule, "run": run, "peak_mb": round(int(kib) / 1024, 1)})
        return sorted(rows, key=lambda r: (list(LIGHT_RULES).index(r["rule"]), r["run"]))


def import_statements(script: Path) -> str:
    """The module-level import statements of ``script``, as source."""
    source = script.read_text()
    tree = ast.parse(source)
    nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(ast.get_source_segment(source, n) for n in nodes)


def import_peak(script: Path) -> float:
    """Peak RSS (MB) of a fresh process that runs the imports of ``script`` (scripts/ and src/ on
    the path, as under Snakemake)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.getenv("PYTHONPATH")]))
    )
    code = f"import sys; sys.path.insert(0, {str(script.parent)!r})\n{import_statements(script)}\n{_PEAK}"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=REPO / "results", help="the results folder of a run")
    p.add_argument("--target", type=float, default=200.0, help="peak RSS target (MB)")
    p.add_argument("--imports", action="store_true", help="also the peak of each script's imports alone")
    p.add_argument("--exact", action="store_true", help="rerun the light jobs, each script's exact peak")
    p.add_argument(
        "--snakemake", default=str(Path(sys.executable).with_name("snakemake")), help="for --exact"
    )
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    args = p.parse_args(argv)
    report = {"target_mb": args.target}
    if args.exact:
        report["exact"] = exact_peaks(args.results.resolve().parent, args.snakemake)
    report["jobs"] = job_peaks(args.results)
    if args.imports:
        report["imports"] = {
            rule: round(import_peak(REPO / "scripts" / script), 1) for rule, script in LIGHT_RULES.items()
        }
    over = [r for r in report["jobs"] if r["max_rss_mb"] is not None and r["max_rss_mb"] >= args.target]
    over += [{"rule": r} for r, mb in report.get("imports", {}).items() if mb >= args.target]
    over += [r for r in report.get("exact", []) if r["peak_mb"] >= args.target]
    report["over_target"] = sorted({r["rule"] for r in over})
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'rule':<18} {'run':<14} {'max_rss MB':>10} {'seconds':>8}  (target < {args.target:.0f} MB)")
        for r in report["jobs"]:
            rss = "NA" if r["max_rss_mb"] is None else f"{r['max_rss_mb']:.1f}"
            flag = "  OVER" if r["rule"] in report["over_target"] else ""
            print(f"{r['rule']:<18} {r['run']:<14} {rss:>10} {r['seconds']:>8.1f}{flag}")
        if not report["jobs"]:
            print(f"no benchmark files of light rules under {args.results}/*/benchmarks/")
        for r in report.get("exact", []):
            flag = "  OVER" if r["peak_mb"] >= args.target else ""
            print(f"exact peak of {r['rule']:<18} {r['run']:<14} {r['peak_mb']:>6.1f} MB (VmHWM){flag}")
        for rule, mb in report.get("imports", {}).items():
            print(f"imports of {rule:<18} {mb:>8.1f} MB{'  OVER' if mb >= args.target else ''}")
    return 1 if report["over_target"] else 0


if __name__ == "__main__":
    sys.exit(main())
