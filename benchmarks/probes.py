"""Benchmark: probes on stored activations (seed 001: 128 layers x 10,000 samples x 768 dims, float16).

Writes synthetic stored activations (a save_to_disk DatasetDict, one float16 column per layer, 80%
train / 20% test; each sample's activation is its class's centre times a per-layer signal, plus unit
noise) and prints one JSON object:

* ``read``: reading every layer of the train split into memory a layer at a time through
  :class:`epochlens.features.stored.Snapshot` (save_to_disk: ``pread`` of each column's buffers at
  the offsets Arrow's memory-mapped metadata gives; npy, safetensors: ``pread`` after the header;
  parquet: Arrow's decoding) against a plain sequential ``readinto`` of the same files
  (``--formats``: each layout a copy of the same activations), interleaved (A B, B A), best of
  ``--repeats``; ``warm``: from the page cache; ``cold``: each side after
  ``posix_fadvise(DONTNEED)`` on the files (the disk's own speed, where the kernel drops them).
  ``ratio`` = plain seconds / epochlens seconds (1.0: as fast as the plain read). Parquet also
  ``decoded_once``: what the workflow does with it (rule ``activations_decoded``), the split
  decoded into ``.npy`` layers ``--decode-threads`` at a time (seconds, and against a plain read
  of the parquet files), then those layers read as every representation job reads them.
* ``representations``: seconds per layer of each representation of ``--representations`` (all
  train rows of one layer, batches of 1024), the mean over ``--rep-layers`` layers, and its width.
* ``probes``: per representation of ``--probe-representations`` (default ``mean``, D wide, and
  ``stats``, 6 wide), the probes of ``--probe-layers`` layers x ``--seeds`` seeds by each side of
  ``--probe-sides``, interleaved (A B .., .. B A), best of ``--repeats``: softmax probes fitted
  together (:mod:`epochlens.probes.batched`), together on mini-batches that the seeds share
  (``probes.batch_order: shared``, :mod:`epochlens.probes.shared_order`) and one at a time
  (:func:`epochlens.probes.softmax.probe_seeds`, the previous code); ridge probes of the classes
  (``probes.kind: ridge``, :mod:`epochlens.probes.ridge_classes`) stacked in float64 and float32,
  and the same probes one (layer, seed) at a time: :func:`epochlens.probes.ridge.fit_ridge_path`
  on the seed's own fit rows (float64 NumPy, the regression's probe), and the stacked code called
  per (layer, seed) in float32 (what stacking and the shared Grams save). Seconds per probe of
  each side; per pair of :data:`COMPARISONS` the
  time ratio and the accuracy difference (mean and largest, row by row: same layer, seed and
  evaluation set); the float32 ridge coefficients' largest difference from float64's (relative).
* ``projection``: the time for every layer x representation x seed at ``--samples`` and at 50,000
  samples, per stacked kind of probe (read, representations and probes scaled linearly in samples
  from the measured rates; a representation's probes timed as those of the measured one of the
  nearest width).
* ``pipeline`` (``--parts pipeline``): the whole run as a user runs it, measured, not projected:
  the snapshot as one folder ``activations/step_1/`` of a working directory, the samples' labels as
  the run's data (``data/labels.npz``: an ``npz`` source with a one-pixel input of zeros, the
  labels of the snapshot's rows, ``holdout_per_class`` a tenth of the training samples), a user
  representation package (``benchreps/pool.py``: :data:`USER_REP`, the L2-normalised mean over
  tokens) and ``config.yaml`` (one run, ``checkpoints.source: activations``, the representations of
  :data:`PIPELINE_REPS`, ``probes.seeds`` 0..``--seeds``-1, ``probes.kind`` ``--probe-kind``, ridge
  in float32 (softmax: ``probes.batch_order`` ``--batch-order``), curvature, ablation and
  influence off); then ``snakemake --cores --cores
  --configfile config.yaml --directory <that folder>`` from the repository root. Prints the wall
  seconds of the whole run, per rule the jobs' summed and largest seconds and largest resident
  memory (each job's ``benchmark:`` file), and the rows of the run's ``tables/probes.csv`` against
  layers x representations x seeds x evaluation sets. Its default shape is ``--tokens 4 --dims
  192`` (768 numbers per sample and layer, as the issue's 768 dims, but with tokens, so that
  ``mean``, ``max``, ``first`` and ``last`` differ); the other parts default to ``--tokens 1 --dims
  768``. ``--snapshot-format parquet``: the run reads the same snapshot as parquet files (and
  decodes it once: one more job).

Usage (the full size needs ~2 GB of disk and about as much memory):
    .venv/bin/python benchmarks/probes.py --layers 128 --samples 10000 --dims 768 --threads 1
    .venv/bin/python benchmarks/probes.py --layers 16 --samples 2000 --dims 256 --threads 1  # smaller
    .venv/bin/python benchmarks/probes.py --parts read --formats save_to_disk npy safetensors parquet
    .venv/bin/python benchmarks/probes.py --parts pipeline --layers 128 --samples 10000  # the whole run
    .venv/bin/python benchmarks/probes.py --parts pipeline --layers 4 --samples 600 --dims 32  # seconds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import _common
import numpy as np
import scipy.linalg  # noqa: F401  (its BLAS loaded before threadpool_limits, so limited too)
import torch
from _probes_pipeline import REPS, SNAPSHOT_FOLDERS, bench_pipeline
from _probes_read import FORMATS, bench_decode, bench_read, copy_as, write_snapshot
from threadpoolctl import threadpool_limits

from epochlens.features import stored_representations as srep
from epochlens.features.stored import Snapshot
from epochlens.features.stored_settings import StoredFeatureSettings
from epochlens.probes.batched import batched_rows
from epochlens.probes.linear import probe_plan
from epochlens.probes.ridge import fit_ridge_path
from epochlens.probes.ridge_classes import class_ridge_rows, fit_class_ridge, pm_targets
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.softmax import probe_seeds

PARTS = ("read", "representations", "probes", "pipeline")
SIDES = (
    "softmax_shared_batched",
    "softmax_batched",
    "softmax_one_at_a_time",
    "ridge_batched",
    "ridge_float32_batched",
    "ridge_one_at_a_time",
    "ridge_float32_one_at_a_time",
)


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=128)
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--dims", type=int, default=None, help="default 768; 192 with --parts pipeline")
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="activations (tokens, dims) per sample; 1: (dims,). Default 1; 4 with --parts pipeline "
        "(4 x 192 = 768 numbers per sample and layer, and mean, max, first, last differ)",
    )
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic activations and labels")
    p.add_argument("--representations", nargs="+", default=list(REPS))
    p.add_argument("--rep-layers", type=int, default=3)
    p.add_argument("--probe-representations", nargs="+", default=["mean", "stats"])
    p.add_argument("--probe-layers", type=int, default=4)
    p.add_argument("--max-epochs", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--probe-sides", nargs="+", choices=SIDES, default=list(SIDES), help="probes to time")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=["save_to_disk"], help="read: layouts")
    p.add_argument(
        "--decode-threads",
        type=int,
        default=2,
        help="read, parquet: layers decoded at a time (the decode job's)",
    )
    p.add_argument("--dir", default=None, help="where to write the activations (default: a temporary folder)")
    p.add_argument(
        "--probe-kind", choices=("ridge", "softmax"), default="ridge", help="pipeline: probes.kind"
    )
    p.add_argument(
        "--batch-order",
        choices=("per_seed", "shared"),
        default="per_seed",
        help="pipeline, softmax probes: probes.batch_order",
    )
    p.add_argument("--cores", type=int, default=2, help="pipeline: snakemake --cores")
    p.add_argument(
        "--snapshot-format",
        choices=tuple(SNAPSHOT_FOLDERS),
        default="save_to_disk",
        help="pipeline: the layout the run reads (parquet: decoded once by the workflow)",
    )
    p.add_argument("--keep", action="store_true", help="pipeline: keep the working directory (under --dir)")
    return p


def shape_defaults(args) -> None:
    """``--tokens`` and ``--dims`` not given: 4 x 192 for the pipeline part, 1 x 768 otherwise."""
    pipeline = "pipeline" in args.parts
    if args.tokens is None:
        args.tokens = 4 if pipeline else 1
    if args.dims is None:
        args.dims = 192 if pipeline else 768


def bench_representations(folder: Path, args, n_train: int) -> dict:
    settings = StoredFeatureSettings(representations=tuple(args.representations))
    snap = Snapshot(folder)
    out = {}
    for name in args.representations:
        fn = srep.resolve(name, settings)
        seconds, width = [], 0
        for layer in snap.layers("train")[: args.rep_layers]:
            array = snap.layer("train", layer)
            t0 = time.perf_counter()
            for lo in range(0, n_train, 1024):
                rows = array.rows(lo, min(lo + 1024, n_train))
                batch = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
                width = srep.checked(fn(batch), len(batch), None, layer, name, array.file).shape[1]
            seconds.append(time.perf_counter() - t0)
        out[name] = {"seconds": float(np.mean(seconds)), "width": int(width)}
    return out


def probe_inputs(folder: Path, args, labels: dict, name: str):
    """(x (G, N, D) float32, y, fit mask, evaluation masks) of ``--probe-layers`` layers of one
    representation: train then test rows, the first tenth of the train rows the holdout."""
    snap = Snapshot(folder)
    rep = srep.resolve(name, StoredFeatureSettings(representations=(name,)))
    xs = []
    for layer in snap.layers("train")[: args.probe_layers]:
        parts = [
            torch.as_tensor(
                rep(
                    torch.from_numpy(
                        np.asarray(snap.layer(s, layer).rows(0, len(labels[s])), dtype=np.float32)
                    )
                )
            )
            for s in ("train", "test")
        ]
        xs.append(torch.cat(parts).numpy())
    y = np.concatenate([labels["train"], labels["test"]])
    n_train = len(labels["train"])
    fit = np.arange(len(y)) < n_train
    fit[: n_train // 10] = False  # the holdout: a tenth of the training samples
    evals = {"holdout": (np.arange(len(y)) < n_train // 10), "test": ~(np.arange(len(y)) < n_train)}
    return np.stack(xs), y, fit, evals


def ridge_one_at_a_time(x: np.ndarray, y, fit, evals, settings: ProbeSettings) -> list[list[dict]]:
    """The class ridge probes fitted one (layer, seed) at a time with the regression's ridge path
    (:func:`epochlens.probes.ridge.fit_ridge_path`: standardise, X'X of the seed's own fit rows, one
    eigendecomposition, every penalty; float64 NumPy), the penalty of best held-out accuracy (ties to
    the larger) scored on the evaluation sets: rows of accuracy per (seed, evaluation set)."""
    plan = probe_plan(y, fit, evals, settings, torch.device("cpu"))
    coded = np.where(y[:, None] == np.arange(plan.n_classes), 1.0, -1.0)
    out = []
    for layer in x:
        rows = []
        for seed, (fit_rows, held) in zip(settings.seeds, plan.seed_rows, strict=True):
            fit_rows, held = fit_rows.numpy(), held.numpy()
            fits = fit_ridge_path(layer[fit_rows], coded[fit_rows], settings.ridge_alphas)
            accs = [np.mean(f.predict(layer[held]).argmax(1) == y[held]) for f in fits]
            best = max((i for i, a in enumerate(accs) if a == max(accs)), key=lambda i: fits[i].alpha)
            for name, ev in plan.eval_sets.items():
                pred = fits[best].predict(layer[ev.numpy()]).argmax(1)
                rows.append(
                    {"seed": seed, "eval_split": name, "accuracy": float(np.mean(pred == y[ev.numpy()]))}
                )
        out.append(rows)
    return out


def ridge_stacked_one_at_a_time(x: np.ndarray, y, fit, evals, settings: ProbeSettings) -> list[list[dict]]:
    """The stacked code (:func:`~epochlens.probes.ridge_classes.class_ridge_rows`) called for one
    (layer, seed) at a time: the same solver, dtype and rows, so its ratio to the stacked side is
    what stacking layers and sharing each layer's Gram among its seeds save."""
    out = []
    for layer in x:
        rows = []
        for seed in settings.seeds:
            one = replace(settings, seeds=(seed,))
            rows += class_ridge_rows(torch.as_tensor(layer[None]), y, fit, evals, one)[0]
        out.append(rows)
    return out


def probe_sides(x: np.ndarray, y, fit, evals, args) -> dict:
    """What ``--probe-sides`` compares: the name of each side and the call that fits its probes."""
    settings = ProbeSettings(seeds=tuple(range(args.seeds)), max_epochs=args.max_epochs)
    shared = replace(settings, batch_order="shared")
    ridge = ProbeSettings(seeds=settings.seeds, kind="ridge")
    ridge32 = ProbeSettings(seeds=settings.seeds, kind="ridge", ridge_dtype="float32")
    sides = {
        "softmax_shared_batched": lambda: batched_rows(torch.as_tensor(x), y, fit, evals, shared),
        "softmax_batched": lambda: batched_rows(torch.as_tensor(x), y, fit, evals, settings),
        "softmax_one_at_a_time": lambda: [
            probe_seeds(torch.as_tensor(v), y, fit, evals, settings, "cpu") for v in x
        ],
        "ridge_batched": lambda: class_ridge_rows(torch.as_tensor(x), y, fit, evals, ridge),
        "ridge_float32_batched": lambda: class_ridge_rows(torch.as_tensor(x), y, fit, evals, ridge32),
        "ridge_one_at_a_time": lambda: ridge_one_at_a_time(x.astype(np.float64), y, fit, evals, ridge),
        "ridge_float32_one_at_a_time": lambda: ridge_stacked_one_at_a_time(x, y, fit, evals, ridge32),
    }
    return {name: sides[name] for name in args.probe_sides}


def accuracy_difference(a: list[list[dict]], b: list[list[dict]]) -> dict:
    """Accuracy of ``a`` minus ``b``, row by row (same layer, seed, evaluation set)."""
    diff = np.array(
        [
            ra["accuracy"] - rb["accuracy"]
            for la, lb in zip(a, b, strict=True)
            for ra, rb in zip(la, lb, strict=True)
        ]
    )
    return {"mean": float(diff.mean()), "max_abs": float(np.abs(diff).max())}


#: (side, baseline) pairs reported as a time ratio (baseline / side) and an accuracy difference.
COMPARISONS = (
    ("softmax_batched", "softmax_one_at_a_time"),
    ("softmax_shared_batched", "softmax_one_at_a_time"),
    ("softmax_shared_batched", "softmax_batched"),
    ("ridge_batched", "ridge_one_at_a_time"),
    ("ridge_float32_batched", "ridge_batched"),
    ("ridge_float32_batched", "ridge_float32_one_at_a_time"),
    ("ridge_float32_batched", "ridge_one_at_a_time"),
    ("ridge_batched", "softmax_one_at_a_time"),
    ("ridge_float32_batched", "softmax_one_at_a_time"),
    ("ridge_batched", "softmax_batched"),
)


def float32_error(x: np.ndarray, y, fit, evals, args) -> dict:
    """Largest coefficient difference of the float32 ridge probes from the float64 ones (relative
    to the largest float64 coefficient), per penalty, over the first layer's seeds."""
    settings = ProbeSettings(seeds=tuple(range(args.seeds)), kind="ridge")
    plan = probe_plan(y, fit, evals, settings, torch.device("cpu"))
    y_dev = torch.as_tensor(y)
    fits = {
        dtype: fit_class_ridge(
            torch.as_tensor(x[:1]),
            pm_targets(y_dev, plan.n_classes, dtype),
            plan.seed_rows,
            settings.ridge_alphas,
        )
        for dtype in (torch.float64, torch.float32)
    }
    return {
        str(alpha): float((c32.double() - c64).abs().max() / c64.abs().max())
        for alpha, c64, c32 in zip(
            settings.ridge_alphas, fits[torch.float64].coef, fits[torch.float32].coef, strict=True
        )
    }


def bench_probes(folder: Path, args, labels: dict, name: str) -> dict:
    x, y, fit, evals = probe_inputs(folder, args, labels, name)
    sides = probe_sides(x, y, fit, evals, args)
    times, results, _ = _common.interleaved(sides, args.repeats, torch.device("cpu"))
    n_probes = len(x) * args.seeds
    out = {"n_features": int(x.shape[2]), "probes": n_probes}
    out["ridge_float32_coefficient_error"] = float32_error(x, y, fit, evals, args)
    out["seconds_per_probe"] = {side: t / n_probes for side, t in times.items()}
    for side, base in COMPARISONS:
        if side in times and base in times:
            out[f"{side}_vs_{base}"] = {
                "speedup": times[base] / times[side],
                "accuracy_difference": accuracy_difference(results[side], results[base]),
            }
    for side, rows in results.items():
        holdout = [r["accuracy"] for layer in rows for r in layer if r["eval_split"] == "holdout"]
        out.setdefault("holdout_accuracy_mean", {})[side] = float(np.mean(holdout))
    for side in ("softmax_batched", "softmax_shared_batched"):
        if side in results:
            out.setdefault("softmax_epochs_run_mean", {})[side] = float(
                np.mean([r["epochs_run"] for rows in results[side] for r in rows])
            )
    return out


def projection(args, read: dict, reps: dict, probes: dict) -> dict:
    """Every layer x representation x seed, each representation's probes timed as the measured
    representation of the nearest width (log scale), for each batched kind of probe measured."""

    def per_probe(name: str, side: str) -> float:
        width = reps[name]["width"]
        nearest = min(probes, key=lambda r: abs(np.log(probes[r]["n_features"]) - np.log(max(width, 1))))
        return probes[nearest]["seconds_per_probe"][side]

    read = read[args.formats[0]]  # the first format's read
    base = {
        "read_s": read["bytes"] / 0.8 / (read["warm"]["epochlens_gb_per_s"] * 1e9),  # train and test
        "representations_s": sum(r["seconds"] for r in reps.values()) / 0.8 * args.layers,
    }
    sides = [s for s in next(iter(probes.values()))["seconds_per_probe"] if "batched" in s]
    for side in sides:
        base[f"probes_{side}_s"] = sum(per_probe(name, side) for name in reps) * args.layers * args.seeds
    out = {}
    for samples in (args.samples, 50_000):
        scale = samples / args.samples
        parts = {k: v * scale for k, v in base.items()}
        shared = parts["read_s"] + parts["representations_s"]
        totals = {side: (shared + parts[f"probes_{side}_s"]) / 60 for side in sides}
        out[f"{samples}_samples"] = {**parts, "total_minutes": totals}
    out["what"] = (
        f"{args.layers} layers x {len(reps)} representations x {args.seeds} seeds, linear in samples "
        "(read, representations, probes' Grams and evaluations; the ridge probes' eigendecompositions do "
        "not grow with samples, so 50,000 is an upper bound for them)"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = options().parse_args(argv)
    torch.set_num_threads(args.threads)
    # NumPy's BLAS as many threads as torch (the one-at-a-time ridge side is NumPy): OpenBLAS's
    # own two threads ran fit_ridge_path ~10x slower on the shared CPU than one thread
    with threadpool_limits(args.threads):
        return _main(args)


def workspace(args):
    """The folder everything is written to: a temporary one, or with ``--keep`` one that stays."""
    if args.keep:
        return contextlib.nullcontext(tempfile.mkdtemp(prefix="probes-bench-", dir=args.dir))
    return tempfile.TemporaryDirectory(dir=args.dir)


def _main(args) -> int:
    shape_defaults(args)
    device = torch.device("cpu")
    rng = np.random.default_rng(args.data_seed)
    with workspace(args) as tmp:
        folder = Path(tmp) / "activations" / "step_1"  # the pipeline part's one snapshot
        t0 = time.perf_counter()
        labels = write_snapshot(folder, args, rng)
        print(f"wrote {folder} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        read = None
        if "read" in args.parts:
            read = {}
            for fmt in args.formats:
                copy = copy_as(folder, fmt, Path(tmp) / fmt)
                read[fmt] = bench_read(copy, fmt, args.repeats, device)
                if fmt == "parquet":
                    read[fmt]["decoded_once"] = bench_decode(
                        copy, Path(tmp), args, len(labels["train"]), device
                    )
                if copy != folder:
                    shutil.rmtree(copy)
        reps = (
            bench_representations(folder, args, len(labels["train"]))
            if "representations" in args.parts
            else None
        )
        probes = (
            {name: bench_probes(folder, args, labels, name) for name in args.probe_representations}
            if "probes" in args.parts
            else None
        )
        pipeline = bench_pipeline(Path(tmp), args, labels) if "pipeline" in args.parts else None
    report = {
        "size": {k: getattr(args, k) for k in ("layers", "samples", "dims", "tokens", "classes", "seeds")},
        "read": read,
        "representation_seconds_per_layer": reps,
        "probes": probes,
        "projection": projection(args, read, reps, probes) if read and reps and probes else None,
        "pipeline": pipeline,
        "environment": _common.environment(device),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
