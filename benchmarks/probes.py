"""Benchmark: probes on stored activations (seed 001: 128 layers x 10,000 samples x 768 dims, float16).

Writes synthetic stored activations (a save_to_disk DatasetDict, one float16 column per layer, 80%
train / 20% test; each sample's activation is its class's centre times a per-layer signal, plus unit
noise) and prints one JSON object:

* ``read``: reading every layer of the train split into memory a layer at a time through
  :class:`epochlens.features.stored.Snapshot` (``pread`` of each column's buffers at the offsets
  Arrow's memory-mapped metadata gives) against a plain sequential ``readinto`` of the same Arrow
  files, interleaved (A B,
  B A), best of ``--repeats``; ``warm``: from the page cache; ``cold``: each side after
  ``posix_fadvise(DONTNEED)`` on the files (the disk's own speed, where the kernel drops them).
  ``ratio`` = plain seconds / epochlens seconds (1.0: as fast as the plain read).
* ``representations``: seconds per layer of each representation of ``--representations`` (all
  train rows of one layer, batches of 1024), the mean over ``--rep-layers`` layers, and its width.
* ``probes``: per representation of ``--probe-representations`` (default ``mean``, D wide, and
  ``stats``, 6 wide), the softmax probes of ``--probe-layers`` layers x
  ``--seeds`` seeds fitted together (:mod:`epochlens.probes.batched`) against one at a time
  (:func:`epochlens.probes.linear.probe_seeds`, the previous code), interleaved, best of
  ``--repeats``: seconds per probe of each, their ratio, and the largest accuracy difference
  between the two fits of the same (layer, seed).
* ``projection``: the time for every layer x representation x seed at ``--samples`` and at 50,000
  samples (read, representations and probes scaled linearly in samples from the measured rates; a
  representation's probes timed as those of the measured one of the nearest width).

Usage (the full size needs ~2 GB of disk and about as much memory):
    .venv/bin/python benchmarks/probes.py --layers 128 --samples 10000 --dims 768 --threads 1
    .venv/bin/python benchmarks/probes.py --layers 16 --samples 2000 --dims 256 --threads 1  # smaller
    .venv/bin/python benchmarks/probes.py --parts read --formats save_to_disk npy safetensors parquet
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _common
import numpy as np
import torch

from epochlens.features import stored_representations as srep
from epochlens.features.stored import Snapshot
from epochlens.features.stored_settings import StoredFeatureSettings
from epochlens.probes.batched import batched_rows
from epochlens.probes.linear import probe_seeds
from epochlens.probes.settings import ProbeSettings

_BUFFER = bytearray(16 << 20)  # allocated once, outside the timings
PARTS = ("read", "representations", "probes")
REPS = ("mean", "max", "first", "last", "norms", "flat", "stats", "spectral")
FORMATS = ("save_to_disk", "npy", "safetensors", "parquet")


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=128)
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--dims", type=int, default=768)
    p.add_argument("--tokens", type=int, default=1, help="activations (tokens, dims) per sample; 1: (dims,)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--representations", nargs="+", default=list(REPS))
    p.add_argument("--rep-layers", type=int, default=3)
    p.add_argument("--probe-representations", nargs="+", default=["mean", "stats"])
    p.add_argument("--probe-layers", type=int, default=4)
    p.add_argument("--max-epochs", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=["save_to_disk"], help="read: layouts")
    p.add_argument("--dir", default=None, help="where to write the activations (default: a temporary folder)")
    return p


def write_snapshot(folder: Path, args, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The synthetic snapshot (module doc); returns each split's labels."""
    import datasets
    import pyarrow as pa

    n_train = int(0.8 * args.samples)
    labels = rng.integers(0, args.classes, args.samples)
    centres = rng.standard_normal((args.classes, args.tokens * args.dims)).astype(np.float32)
    tables = {"train": {}, "test": {}}
    for layer in range(args.layers):
        signal = 0.05 + 0.3 * np.sin(np.pi * layer / max(args.layers - 1, 1))
        x = (signal * centres[labels] + rng.standard_normal((args.samples, centres.shape[1]))).astype(
            np.float16
        )
        for split, rows in (("train", slice(0, n_train)), ("test", slice(n_train, None))):
            values = pa.array(x[rows].ravel())
            column = pa.FixedSizeListArray.from_arrays(values, args.dims)
            if args.tokens > 1:
                column = pa.FixedSizeListArray.from_arrays(column, args.tokens)
            tables[split][f"layer_{layer}"] = column
    splits = {s: datasets.Dataset(pa.table(t)) for s, t in tables.items()}
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return {"train": labels[:n_train], "test": labels[n_train:]}


def copy_as(folder: Path, fmt: str, dest: Path) -> Path:
    """The train split of the save_to_disk snapshot ``folder`` in layout ``fmt`` (a layer at a time
    for npy and safetensors; parquet: the Arrow table written as it is, default compression)."""
    if fmt == "save_to_disk":
        return folder
    split = dest / "train"
    split.mkdir(parents=True)
    if fmt == "parquet":
        import datasets
        import pyarrow.parquet as pq

        pq.write_table(datasets.load_from_disk(str(folder / "train")).data.table, split / "part-0.parquet")
        return dest
    from safetensors.numpy import save_file

    snap = Snapshot(folder)
    for layer in snap.layers("train"):
        values = snap.layer("train", layer).rows(0, len(snap.layer("train", layer)))
        if fmt == "npy":
            np.save(split / f"{layer}.npy", values)
        else:
            save_file({"x": np.ascontiguousarray(values)}, str(split / f"{layer}.safetensors"))
    return dest


def split_files(folder: Path) -> list[Path]:
    """The train split's files (the plain read's): Arrow, parquet, npy or safetensors."""
    return sorted(
        p for p in (folder / "train").iterdir() if p.suffix in (".arrow", ".parquet", ".npy", ".safetensors")
    )


def drop_cache(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_layers(snap: Snapshot, batch: int = 1024) -> int:
    """Every train layer into memory, a layer at a time, in the features job's batches of rows
    (``LayerArray.rows``: a view of a layer already read, a safetensors slice read here)."""
    done = 0
    for layer in snap.layers("train"):
        array = snap.layer("train", layer)
        for lo in range(0, len(array), batch):
            done += array.rows(lo, min(lo + batch, len(array))).nbytes
    return done


def plain_read(files: list[Path]) -> int:
    buffer = memoryview(_BUFFER)
    done = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                done += n
    return done


def bench_read(folder: Path, fmt: str, repeats: int, device: torch.device) -> dict:
    """Read throughput against the plain read (module doc). ``epochlens``: a snapshot opened once,
    so that, as the plain read's buffer, the memory its layers are read into exists before the
    timings (a job allocates it once per split); ``opened_per_pass``: opened in each pass (its
    metadata and the buffer's first page faults counted)."""
    files = split_files(folder)
    size = sum(p.stat().st_size for p in files)
    out = {"bytes": size, "files": len(files)}
    opened = Snapshot(folder, fmt)
    read_layers(opened)  # sizes its buffer
    for mode in ("warm", "cold"):
        prep = (lambda: drop_cache(files)) if mode == "cold" else (lambda: None)
        sides = {
            "epochlens": lambda prep=prep: (prep(), read_layers(opened)),
            "opened_per_pass": lambda prep=prep: (prep(), read_layers(Snapshot(folder, fmt))),
            "plain": lambda prep=prep: (prep(), plain_read(files)),
        }
        times, _, _ = _common.interleaved(sides, repeats, device)
        out[mode] = {
            "epochlens_gb_per_s": size / times["epochlens"] / 1e9,
            "plain_gb_per_s": size / times["plain"] / 1e9,
            "ratio": times["plain"] / times["epochlens"],
            "ratio_opened_per_pass": times["plain"] / times["opened_per_pass"],
        }
    return out


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


def bench_probes(folder: Path, args, labels: dict, name: str) -> dict:
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
    x = np.stack(xs)
    y = np.concatenate([labels["train"], labels["test"]])
    n_train = len(labels["train"])
    fit = np.arange(len(y)) < n_train
    fit[: n_train // 10] = False  # the holdout: a tenth of the training samples
    evals = {"holdout": (np.arange(len(y)) < n_train // 10), "test": ~(np.arange(len(y)) < n_train)}
    settings = ProbeSettings(seeds=tuple(range(args.seeds)), max_epochs=args.max_epochs)
    sides = {
        "batched": lambda: batched_rows(torch.as_tensor(x), y, fit, evals, settings),
        "one_at_a_time": lambda: [probe_seeds(torch.as_tensor(v), y, fit, evals, settings, "cpu") for v in x],
    }
    times, results, _ = _common.interleaved(sides, args.repeats, torch.device("cpu"))
    together, alone = results["batched"], results["one_at_a_time"]
    diff = max(
        abs(a["accuracy"] - b["accuracy"])
        for rows_a, rows_b in zip(alone, together, strict=True)
        for a, b in zip(rows_a, rows_b, strict=True)
    )
    per_batched = times["batched"] / (len(x) * args.seeds)
    per_single = times["one_at_a_time"] / (len(x) * args.seeds)
    epochs = [r["epochs_run"] for rows in together for r in rows]
    holdout = [r["accuracy"] for rows in together for r in rows if r["eval_split"] == "holdout"]
    return {
        "n_features": int(x.shape[2]),
        "probes": args.probe_layers * args.seeds,
        "seconds_per_probe_batched": per_batched,
        "seconds_per_probe_one_at_a_time": per_single,
        "speedup": per_single / per_batched,
        "max_accuracy_difference": diff,
        "epochs_run_mean": float(np.mean(epochs)),
        "holdout_accuracy_range": [min(holdout), max(holdout)],
    }


def projection(args, read: dict, reps: dict, probes: dict) -> dict:
    """Every layer x representation x seed, each representation's probes timed as the measured
    representation of the nearest width (log scale)."""

    def per_probe(name: str) -> float:
        width = reps[name]["width"]
        nearest = min(probes, key=lambda r: abs(np.log(probes[r]["n_features"]) - np.log(width)))
        return probes[nearest]["seconds_per_probe_batched"]

    read = read[args.formats[0]]  # the first format's read
    base = {
        "read_s": read["bytes"] / 0.8 / (read["warm"]["epochlens_gb_per_s"] * 1e9),  # train and test
        "representations_s": sum(r["seconds"] for r in reps.values()) / 0.8 * args.layers,
        "probes_s": sum(per_probe(name) for name in reps) * args.layers * args.seeds,
    }
    out = {}
    for samples in (args.samples, 50_000):
        scale = samples / args.samples
        parts = {k: v * scale for k, v in base.items()}
        out[f"{samples}_samples"] = {**parts, "total_minutes": sum(parts.values()) / 60}
    out["what"] = (
        f"{args.layers} layers x {len(reps)} representations x {args.seeds} seeds, linear in samples"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = options().parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp) / "snapshot"
        t0 = time.perf_counter()
        labels = write_snapshot(folder, args, rng)
        print(f"wrote {folder} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        read = None
        if "read" in args.parts:
            read = {}
            for fmt in args.formats:
                copy = copy_as(folder, fmt, Path(tmp) / fmt)
                read[fmt] = bench_read(copy, fmt, args.repeats, device)
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
    report = {
        "size": {k: getattr(args, k) for k in ("layers", "samples", "dims", "tokens", "classes", "seeds")},
        "read": read,
        "representation_seconds_per_layer": reps,
        "probes": probes,
        "projection": projection(args, read, reps, probes) if read and reps and probes else None,
        "environment": _common.environment(device),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
