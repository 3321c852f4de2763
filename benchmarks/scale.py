"""Benchmark: how each job's peak memory, its seconds per sample and the files of ``results/`` grow
with the number of training samples N, on the loss-of-plasticity study in its original layout
(config/cifar100_lop.yaml: a ``cifar-100-python`` folder of pickles with N random training images
and CIFAR's 10,000 test images, a class order, one randomly initialised ResNet-18 checkpoint saved
as a bare state_dict), index 0 only, from a project folder of its own. ``--model small_cnn`` puts
the built-in small CNN in its place: the data's share of each job's memory and time shows.

``--stages thumbnails`` (the default) builds the run's data set and its thumbnails only;
``--stages samples`` the per-sample stages (evaluation, sample outputs, dossier, thumbnails,
explorer; curvature, features, probes and ablation off): a ResNet-18 on every image (36 s of
forward passes at N = 50,000 on two CPU cores); ``--stages all`` every stage, influence (EK-FAC)
too; ``--stages influence`` the projected-gradient store (``--methods``, logra by default; every
class trained, the dossier) with ``--queries`` queries, its (Q, N) scores kept whole up to ``--pairwise-gb``.
``--source imagefolder`` or ``npz``: random pixels as well, in an image folder of PNGs or an ``.npz``,
normalised from the training images; ``text``: N sentences and a tiny BERT in the
formats of config/examples/text_classifier.yaml (benchmarks/_text_project.py). Peaks and
seconds are Snakemake's ``benchmark:`` files (``max_rss``: sampled from 0.5 s on), one row per
rule; ``growth`` is the ratio of the largest N's peak to the smallest's; ``asked_mb`` the
``mem_mb`` the workflow gave the rule's jobs from the run's shapes (``epochlens.memory``), and
the jobs whose peak passed it are listed; ``own_peak_mb`` each job's own high-water mark
(``ru_maxrss``, written as it exits: benchmarks/_peak), which the sampling misses on short jobs.

    .venv/bin/python benchmarks/scale.py --sizes 10000 50000 [--stages samples|all] [--model small_cnn]
        [--source imagefolder|npz|text]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import _common
import numpy as np
import pandas as pd
import torch
import yaml
from _probes_pipeline import job_benchmarks, job_peaks, run_snakemake
from _text_project import write_text_project

from epochlens.models.networks import MODELS, build_model

RUN, EPOCH = "cifar100_lop", 200
OFF = {"enabled": False}
SOURCES = ("cifar100", "imagefolder", "npz", "text")


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000], help="training images (x100)")
    p.add_argument("--stages", choices=["thumbnails", "samples", "all", "influence"], default="thumbnails")
    p.add_argument("--queries", type=int, default=100, help="--stages influence: queries scored")
    p.add_argument(
        "--pairwise-gb", type=float, default=2.0, help="--stages influence: influence.projection's"
    )
    p.add_argument("--methods", nargs="+", default=["logra"], help="--stages influence: the store's methods")
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18_lop", help="the checkpoint's network")
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="cifar100",
        help="the data: CIFAR-100 pickles, an image folder, an npz, sentences (a tiny BERT; --model unused)",
    )
    p.add_argument("--cores", type=int, default=2)
    p.add_argument(
        "--keep", type=Path, help="build the projects here and keep them (default: a temporary folder)"
    )
    p.add_argument("--json", action="store_true", help="also print the rows as JSON")
    return p


def write_project(
    work: Path, n_train: int, model: str = "resnet18_lop", stages: str = "samples", source: str = "cifar100",
    queries: int = 100, pairwise_gb: float = 2.0, methods: tuple[str, ...] = ("logra",),
) -> Path:  # fmt: skip
    """The study's inputs and its config (paths into ``work``); returns the config file. ``source``
    other than cifar100: random pixels as well, in an image folder or an npz, normalised from them."""
    writers = {"cifar100": _common.write_cifar100, "imagefolder": _common.write_image_folder}
    where = {"cifar100": "cifar-100-python", "imagefolder": "images", "npz": "data.npz"}[source]
    data = writers.get(source, _common.write_npz)(work / where, n_train, 10_000)
    cfg = _common.lop_config(data, work / "lop")
    cfg["runs"][RUN]["data"]["source"] = source
    (work / "lop/class_order").mkdir(parents=True, exist_ok=True)
    np.save(work / "lop/class_order/index-0.npy", np.random.default_rng(100).permutation(100))
    (work / "lop/model_parameters").mkdir(parents=True, exist_ok=True)
    net = build_model(model, num_classes=100, in_channels=3, seed=0)
    torch.save(net.state_dict(), work / f"lop/model_parameters/index-0_epoch-{EPOCH}.pt")
    run = cfg["runs"][RUN]
    run["model"]["name"] = model
    run["data"]["holdout_per_class"] = min(50, n_train // 200)  # the study's 50 from N = 10,000 on
    run.update(indices=[0], epochs=[EPOCH])
    if stages == "all":
        run["influence"] = {"enabled": True}
    else:
        run.update(curvature=OFF, features=OFF, probes=OFF, ablation=OFF)
    if stages == "influence":  # every class trained: N training samples in the store
        run["schedule"]["initial_classes"] = 100
        run["influence"] = {"enabled": True, "methods": list(methods), "queries": {"max_count": queries}}
        run["influence"]["projection"] = {"pairwise_gb": pairwise_gb}
    cfg["device"] = "cpu"
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return work / "config.yaml"


def measure(
    work: Path, n_train: int, stages: str, cores: int, model: str, source: str, **influence
) -> list[dict]:
    """Build and run one project; a row per rule: peak MB, seconds, seconds per 1,000 samples."""
    if source == "text":
        config = write_text_project(work, n_train, stages)
    else:
        config = write_project(work, n_train, model, stages, source, **influence)
    targets = [f"results/{RUN}/samples/thumbs"] if stages == "thumbnails" else []
    _, output = run_snakemake(work, config, cores, *targets, peaks=work / "peaks")
    own = job_peaks(work / "peaks")
    results = work / "results"
    files = sum(1 for p in results.rglob("*") if p.is_file())
    size_mb = sum(p.stat().st_size for p in results.rglob("*") if p.is_file()) / 1e6
    rows = []
    for rule, r in job_benchmarks(work, output).items():
        per_1000 = 1000 * r["seconds_sum"] / n_train
        rows.append({"n": n_train, "rule": rule, "jobs": r["jobs"], "peak_mb": r["max_rss_mb"]})
        rows[-1]["own_peak_mb"] = own.get(rule)  # the job's own high-water mark (ru_maxrss)
        rows[-1]["asked_mb"] = r.get("asked_mb")  # mem_mb from the run (epochlens.memory)
        rows[-1].update(seconds=r["seconds_sum"], s_per_1000=per_1000, files=files, results_mb=size_mb)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = options().parse_args(argv)
    if args.source == "text" and args.stages == "thumbnails":
        raise SystemExit("scale.py: a text run has no thumbnails: --stages samples or all")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            work = (args.keep or Path(tmp)) / f"n{n}"
            influence = {"queries": args.queries, "pairwise_gb": args.pairwise_gb, "methods": args.methods}
            rows += measure(work, n, args.stages, args.cores, args.model, args.source, **influence)
    table = pd.DataFrame(rows)
    peaks = table.pivot(index="rule", columns="n", values="own_peak_mb")
    peaks["growth"] = peaks[max(args.sizes)] / peaks[min(args.sizes)]
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
        print("\nown peak MB per rule and growth (largest N / smallest N):")
        print(peaks.to_string())
        short = table[table[["peak_mb", "own_peak_mb"]].max(axis=1) > table["asked_mb"]]
        print("\njobs whose peak passed the mem_mb they asked for:", "none" if short.empty else "")
        if not short.empty:
            print(short[["n", "rule", "peak_mb", "own_peak_mb", "asked_mb"]].to_string(index=False))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
