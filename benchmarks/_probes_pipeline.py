"""The pipeline part of benchmarks/probes.py (``--parts pipeline``): the whole run of stored activations as a
user runs it, measured (see that module's doc).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: The built-in representations of token activations.
REPS = ("mean", "max", "first", "last", "norms", "flat", "stats", "spectral")
#: The pipeline part's user representation (``benchreps/pool.py`` in its working directory).
USER_REP = "benchreps.pool:l2_mean"
USER_REP_CODE = '''"""The pipeline benchmark's own representation (benchmarks/probes.py --parts pipeline)."""

import torch


def l2_mean(act):
    """(B, T, D) or (B, D) -> (B, D): the mean over tokens, L2-normalised."""
    return torch.nn.functional.normalize(act.reshape(len(act), -1, act.shape[-1]).mean(1), dim=1)
'''


#: The pipeline part's nine representations: the built-ins of token activations and the user's.
PIPELINE_REPS = (*REPS, USER_REP)


#: The pipeline part's snapshot folder per layout it can run from.
SNAPSHOT_FOLDERS = {"save_to_disk": "activations", "parquet": "activations_parquet"}


def pipeline_config(args, n_train: int) -> dict:
    """The pipeline part's config (module doc): one run of stored activations, features and probes."""
    probes = {"kind": args.probe_kind, "seeds": list(range(args.seeds)), "targets": ["class"]}
    if args.probe_kind == "ridge":
        probes["ridge_dtype"] = "float32"
    else:
        probes["max_epochs"] = args.max_epochs
        probes["batch_order"] = args.batch_order
    run = {
        "data": {
            "source": "npz",
            "path": "data/labels.npz",
            "holdout_per_class": max(1, n_train // (10 * args.classes)),  # a tenth of the train rows
        },
        "schedule": "none",
        "checkpoints": {
            "source": "activations",
            "path": f"{SNAPSHOT_FOLDERS[args.snapshot_format]}/step_{{epoch}}",
            "format": args.snapshot_format,
        },
        "features": {
            "representations": list(PIPELINE_REPS),
            "project_path": "code",
            "spectral_k": min(8, args.tokens),  # a (tokens, dims) matrix has rank <= tokens
        },
        "probes": probes,
        **{stage: {"enabled": False} for stage in ("curvature", "ablation", "influence")},
    }
    return {"device": "cpu", "runs": {"bench": run}}


def write_pipeline_inputs(work: Path, args, labels: dict) -> Path:
    """Beside the snapshot ``work/activations/step_1``: the run's data (the snapshot rows' labels,
    a one-pixel input of zeros: the probes read only the labels and the holdout), the user
    representation ``code/benchreps/pool.py`` and ``config.yaml``; returns the config's path. With
    ``--snapshot-format parquet`` the snapshot is also written as ``activations_parquet/step_1/
    {train,test}.parquet`` (each split's Arrow table, pyarrow's defaults), which the run reads."""
    import datasets
    import pyarrow.parquet as pq
    import yaml

    if args.snapshot_format == "parquet":
        dest = work / SNAPSHOT_FOLDERS["parquet"] / "step_1"
        dest.mkdir(parents=True)
        for split, ds in datasets.load_from_disk(str(work / "activations" / "step_1")).items():
            pq.write_table(ds.data.table, dest / f"{split}.parquet")

    (work / "data").mkdir()
    np.savez(
        work / "data" / "labels.npz",
        x_train=np.zeros((len(labels["train"]), 1), np.uint8),
        y_train=labels["train"],
        x_test=np.zeros((len(labels["test"]), 1), np.uint8),
        y_test=labels["test"],
    )
    package = work / "code" / "benchreps"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pool.py").write_text(USER_REP_CODE)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(pipeline_config(args, len(labels["train"])), sort_keys=False))
    return config


def run_snakemake(
    work: Path, config: Path, cores: int, *targets: str, peaks: Path | None = None
) -> tuple[float, str]:
    """``snakemake --cores N --configfile config --directory work [targets]`` from the repository root, this
    checkout's library first on the jobs' path: (wall seconds, its output). Its output is also kept
    in ``work/snakemake.log``; a failed run stops the benchmark with the output's tail. ``peaks``:
    a folder where each job writes its own peak memory (_peak/sitecustomize.py; :func:`job_peaks`)."""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--cores", str(cores), "--directory", str(work)]
    cmd += ["--configfile", str(config)]
    first = [str(Path(__file__).parent / "_peak")] if peaks else []
    path = os.pathsep.join(p for p in (*first, str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, EPOCHLENS_PEAKS=str(peaks)) if peaks else dict(os.environ)
    if peaks:
        peaks.mkdir(parents=True, exist_ok=True)
    print(f"running {' '.join(cmd)} in {REPO}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env=dict(env, PYTHONPATH=path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wall = time.perf_counter() - t0
    (work / "snakemake.log").write_text(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}")
    return wall, proc.stdout


def job_peaks(folder: Path) -> dict[str, float]:
    """The largest peak (MB) of the jobs of each script (``tmpXXXX.sample_outputs.py`` ->
    ``sample_outputs``) that wrote to ``folder`` (:func:`run_snakemake`'s ``peaks``)."""
    out: dict[str, float] = {}
    for f in folder.glob("*.tsv"):
        for line in f.read_text().splitlines():
            script, kb = line.rsplit("\t", 1)
            parts = script.split(".")
            if len(parts) == 3 and parts[0].startswith("tmp") and parts[2] == "py":
                out[parts[1]] = max(out.get(parts[1], 0.0), int(kb) / 1000)
    return out


def job_benchmarks(work: Path, output: str) -> dict:
    """Per rule: jobs, summed and largest seconds, largest max_rss (MB) of its jobs' ``benchmark:``
    files (Snakemake's: s, max_rss, ...), each file's rule from the job block that names it in the
    run's output, and the largest ``mem_mb`` its jobs asked for (``asked_mb``, where declared).
    Snakemake samples memory from 0.5 s on, so a rule whose every job ended sooner has
    ``max_rss`` "NA": its ``max_rss_mb`` is None (not measured), never 0."""
    import pandas as pd

    rules, asked = {}, {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", output):
        rule = re.match(r"(?:local)?rule (\w+):", block)
        bench = re.search(r"^\s*benchmark: (\S+)", block, re.M)
        mem = re.search(r"^\s*resources: .*\bmem_mb=(\d+)", block, re.M)
        if rule and bench:
            rules[bench.group(1)] = rule.group(1)
            asked[bench.group(1)] = int(mem.group(1)) if mem else None
    out = {}
    for path, rule in sorted(rules.items()):
        row = pd.read_csv(work / path, sep="\t").iloc[0]
        r = out.setdefault(rule, {"jobs": 0, "seconds_sum": 0.0, "seconds_max": 0.0, "max_rss_mb": None})
        if asked[path] is not None:  # the mem_mb it asked for (the workflow's, from the run)
            r["asked_mb"] = max(r.get("asked_mb", 0), asked[path])
        r["jobs"] += 1
        r["seconds_sum"] += float(row["s"])
        r["seconds_max"] = max(r["seconds_max"], float(row["s"]))
        rss = pd.to_numeric(row["max_rss"], errors="coerce")  # "NA" (or "-"): not sampled
        if pd.notna(rss):
            r["max_rss_mb"] = max(r["max_rss_mb"] or 0.0, float(rss))
    return out


def probe_rows(work: Path, args) -> dict:
    """The probes the run wrote: per-seed rows of its per-representation tables and rows of its
    ``tables/probes.csv`` (one per layer, representation and evaluation set, over ``n_seeds``)
    against layers x representations x seeds x evaluation sets."""
    import pandas as pd

    from epochlens.layout import RESULTS

    per_seed = pd.concat(
        [pd.read_csv(work / RESULTS.stored_probe_table("bench", 0, 1, rep)) for rep in PIPELINE_REPS]
    )
    summary = pd.read_csv(work / RESULTS.table("probes", "bench"))
    evals = sorted(set(summary["eval_split"]))
    expected = args.layers * len(PIPELINE_REPS) * args.seeds * len(evals)
    return {
        "eval_sets": evals,
        "expected": expected,
        "per_seed_rows": len(per_seed),
        "summary_rows": len(summary),
        "summary_n_seeds_total": int(summary["n_seeds"].sum()),
        "complete": len(per_seed) == int(summary["n_seeds"].sum()) == expected,
    }


def bench_pipeline(work: Path, args, labels: dict) -> dict:
    """The whole run through the workflow (module doc, ``pipeline``)."""
    config = write_pipeline_inputs(work, args, labels)
    wall, output = run_snakemake(work, config, args.cores)
    return {
        "working_directory": str(work),
        "wall_seconds": wall,
        "rules": job_benchmarks(work, output),
        "probe_rows": probe_rows(work, args),
        "representations": list(PIPELINE_REPS),
        "probe_kind": args.probe_kind,
        "batch_order": args.batch_order if args.probe_kind == "softmax" else None,
        "snapshot_format": args.snapshot_format,
        "cores": args.cores,
    }
