"""The read part of benchmarks/probes.py: synthetic stored activations written in each layout, and reading
them through epochlens against a plain read (warm and cold), and a parquet snapshot decoded once (see
that module's doc).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import _common
import numpy as np
import scipy.linalg  # noqa: F401  (its BLAS loaded before threadpool_limits, so limited too)
import torch

from epochlens.features.stored import Snapshot
from epochlens.features.stored_settings import StoredFeatureSettings

_BUFFER = bytearray(16 << 20)  # allocated once, outside the timings


FORMATS = ("save_to_disk", "npy", "safetensors", "parquet")


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
    (``LayerArray.rows``: a view of a layer already read; a bfloat16 safetensors layer widened here)."""
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


def bench_decode(folder: Path, tmp: Path, args, n_train: int, device: torch.device) -> dict:
    """What the workflow does with a parquet snapshot (rule activations_decoded): its train split
    decoded once into ``.npy`` layers (``--decode-threads`` layers at a time; seconds, best of
    ``--repeats``, and that against one plain read of the parquet files), then the decoded layers'
    read against their own plain read (:func:`bench_read`), as every representation job reads."""
    from epochlens.features.stored_decode import decode_parquet

    settings = StoredFeatureSettings(splits=("train",))
    dest = tmp / "parquet_decoded"
    best = float("inf")
    for _ in range(args.repeats):
        done = decode_parquet(folder, dest, {"train": n_train}, settings, threads=args.decode_threads)
        best = min(best, done.seconds)
    files = split_files(folder)
    plain = min(_timed(lambda: plain_read(files)) for _ in range(args.repeats))
    out = {
        "threads": args.decode_threads,
        "seconds": best,
        "decoded_gb": done.nbytes / 1e9,
        "ratio_to_plain_read_of_the_parquet": plain / best,
        "read_after": bench_read(dest, "npy", args.repeats, device),
    }
    shutil.rmtree(dest)
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
