"""Benchmark: wall time of ``snakemake --dry-run`` on the full loss-of-plasticity study, new against old.

The study is ``config/cifar100_lop.yaml`` (ResNet-18, 21 checkpoints x 3 indices) with every stage
on: curvature, features, probes and ablation at every checkpoint, influence (its default methods)
at the last one. Its inputs are made in a temporary folder: a ``cifar-100-python`` folder of tiny
pickles, the class orders and 63 empty checkpoint files (planning needs the files to exist, not
their content). Each side runs as a user runs it, in a fresh process:

    python -m snakemake --dry-run --cores 2 --snakefile <workflow>/Snakefile \
        --directory <empty working directory> --configfile lop.yaml

* ``new``: this checkout's workflow;
* ``old``: the workflow at ``--baseline`` (default 81e85bb, main before the layout refactor),
  exported with ``git archive`` to a temporary folder. That version merged the user's config
  with the embedded default (it also planned the digits demo: 613 jobs); it is given
  ``--replace-workflow-config`` so that both sides plan the same jobs (``jobs`` in the report).

The sides alternate (old new, new old, ...) and each keeps its fastest repeat (benchmarks/_common.py).
Every run's process is new, so each timing includes starting Python, importing Snakemake and
its plugins (``floor_seconds``: the same for a workflow with one empty rule) and writing the
dry run's report. Usage:

    .venv/bin/python benchmarks/dryrun.py --json [--repeats 3] [--baseline REF]

``--image-folder N``: the study's data an ImageFolder tree of N training files (and N / 5 test
files) instead of the CIFAR pickles: what planning costs per file of a data folder.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import _common
import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
EPOCHS = range(0, 4001, 200)
INDICES = (0, 1, 2)


def write_image_folder(folder: Path, n: int) -> dict:
    """An ImageFolder tree of ``n`` training and n / 5 test files (one byte each: a plan reads no
    image) in the study's 100 class folders; the run's data section that reads it."""
    for split, count in (("train", n), ("test", n // 5)):
        for c in range(100):
            (folder / split / f"class_{c:03d}").mkdir(parents=True)
        for i in range(count):
            (folder / split / f"class_{i % 100:03d}" / f"img_{i}.png").write_bytes(b"x")
    return {"source": "imagefolder", "path": str(folder), "images": {"size": 32}}


def write_study(root: Path, image_folder: int = 0) -> Path:
    """The study's inputs under ``root`` and its config file (returned); with ``image_folder``, its
    data an ImageFolder tree of that many training files instead of the CIFAR pickles."""
    orders, ckpts = root / "lop/class_order", root / "lop/model_parameters"
    orders.mkdir(parents=True)
    ckpts.mkdir(parents=True)
    for i in INDICES:
        np.save(orders / f"index-{i}.npy", np.random.default_rng(i).permutation(100))
        for epoch in EPOCHS:
            (ckpts / f"index-{i}_epoch-{epoch}.pt").touch()
    cfg = _common.lop_config(_common.write_cifar100(root / "cifar-100-python", 100, 100), root / "lop")
    run = cfg["runs"]["cifar100_lop"]
    run["influence"] = {"enabled": True}
    if image_folder:
        run["data"] = write_image_folder(root / "images", image_folder)
    path = root / "lop.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def export(ref: str, dest: Path) -> Path:
    """The workflow at git ``ref`` of this repository, as files under ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def dry_run(workflow: Path, workdir: Path, configfile: Path | None, *extra: str) -> str:
    """One dry run in a new process (the library of ``workflow`` first on the path); its output."""
    cmd = [sys.executable, "-m", "snakemake", "--dry-run", "--cores", "2"]
    cmd += ["--snakefile", str(workflow / "Snakefile"), "--directory", str(workdir), *extra]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "PYTHONPATH": str(workflow / "src")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"dry run of {workflow} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr


def job_count(out: str) -> int:
    m = re.search(r"^total\s+(\d+)$", out, re.MULTILINE)
    return int(m.group(1)) if m else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="81e85bb", help="git ref of the old workflow")
    p.add_argument("--repeats", type=int, default=3, help="timings: the fastest repeat of each side")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    p.add_argument("--image-folder", type=int, default=0, help="the data: an image folder of N files")
    args = p.parse_args(argv)
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="dryrun-bench-") as tmp:
        tmp = Path(tmp)
        cfg = write_study(tmp / "study", args.image_folder)
        old = export(args.baseline, tmp / "old")
        empty = tmp / "empty"
        empty.mkdir()
        (empty / "Snakefile").write_text("rule all:\n    input: []\n")
        sides = {
            "old": (old, cfg, "--replace-workflow-config"),
            "new": (REPO, cfg),
            "floor": (empty, None),
        }
        for name in sides:
            (tmp / f"work-{name}").mkdir()
        calls = {
            name: (lambda name=name, spec=spec: dry_run(spec[0], tmp / f"work-{name}", *spec[1:]))
            for name, spec in sides.items()
        }
        if not args.json:
            print(f"{args.repeats} interleaved dry runs of each side ...", file=sys.stderr, flush=True)
        seconds, outputs, _ = _common.interleaved(calls, args.repeats, cpu)
        jobs = {name: job_count(outputs[name]) for name in ("old", "new")}
        if jobs["old"] != jobs["new"]:
            raise RuntimeError(f"the sides plan different jobs: {jobs}")
        report = {
            "study": "config/cifar100_lop.yaml: 3 indices x 21 checkpoints, every stage",
            "image_folder_files": args.image_folder,
            "jobs": jobs["new"],
            "old_seconds": round(seconds["old"], 2),
            "new_seconds": round(seconds["new"], 2),
            "floor_seconds": round(seconds["floor"], 2),
            "speedup": round(seconds["old"] / seconds["new"], 2),
            "output_bytes": {name: len(outputs[name]) for name in ("old", "new")},
            "baseline": args.baseline,
            "repeats": args.repeats,
            "load_average_1min": _common.load_average(),
            "cpu": _common.device_name(cpu),
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
