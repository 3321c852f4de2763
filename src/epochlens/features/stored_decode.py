"""A parquet snapshot of stored activations decoded once into ``.npy`` layers.

Arrow decodes parquet at about 0.01x a plain read of the same files (float16 is stored as
2-byte fixed-length byte arrays, decoded value by value; README, "Probes on stored
activations"), and each representation of a run of stored activations is its own job that reads
every layer. So the workflow decodes a parquet snapshot once, a layer at a time, into the ``npy``
layout (``<split>/<layer>.npy``, the ids as ``<split>/<id_column>.npy``), which every
representation job then reads at the speed of the disk. Values keep their stored dtype (float16
stays float16): the folder holds the activations' own bytes, nothing wider. The checks of
:mod:`epochlens.features.stored` (rows per sample, ids, layers asked for) run here, on the user's
files, so that their errors name the parquet file.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from epochlens.errors import FeatureError
from epochlens.features.stored import LayerArray, Snapshot, checked_layer, selected_layers
from epochlens.features.stored_settings import StoredFeatureSettings


@dataclass
class Decoded:
    """What :func:`decode_parquet` wrote: layers, bytes of values and seconds."""

    layers: list[str]
    nbytes: int
    seconds: float


def decode_parquet(
    source: str | Path,
    dest: str | Path,
    counts: dict[str, int],
    settings: StoredFeatureSettings,
    threads: int = 1,
) -> Decoded:
    """Decode the layers ``settings`` asks for (and its id column) of each split of the parquet
    snapshot ``source`` into ``dest`` as ``.npy`` files, ``threads`` layers at a time; ``counts``:
    the run's samples per split. ``dest`` appears whole or not at all: it is written beside itself
    and renamed, so a failed or killed job leaves no half folder."""
    t0 = time.perf_counter()
    source, dest = Path(source), Path(dest)
    snapshot = Snapshot(source, "parquet", settings.id_column)
    layers = selected_layers(snapshot, settings)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    nbytes, threads = 0, max(1, threads)
    try:
        for split in settings.splits:
            snapshot.order(split, counts[split])  # the ids, checked on the user's file
            (tmp / split).mkdir(parents=True)
            names = layers + ([settings.id_column] if settings.id_column else [])
            parts = [names[k::threads] for k in range(threads)]
            with ThreadPoolExecutor(threads) as pool:  # Arrow decodes without holding the GIL
                jobs = [
                    pool.submit(_decode, source, settings.id_column, split, part, counts[split], tmp)
                    for part in parts
                ]
                nbytes += sum(job.result() for job in jobs)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Decoded(layers, nbytes, time.perf_counter() - t0)


def _decode(source: Path, id_column: str | None, split: str, names: list[str], n: int, tmp: Path) -> int:
    """Decode ``names`` of ``split`` one after another (with a snapshot of this thread's own: its
    parquet files opened once for them) into ``tmp/<split>/<name>.npy``; bytes written."""
    snapshot = Snapshot(source, "parquet", id_column)
    written = 0
    for name in names:
        layer = snapshot.layer(split, name) if name == id_column else checked_layer(snapshot, split, name, n)
        written += write_npy(layer, tmp / split / f"{name}.npy")
    return written


def write_npy(layer: LayerArray, path: Path) -> int:
    """``layer``'s rows as one ``.npy`` file, written piece by piece (no concatenated copy of the
    layer); bytes of values written."""
    if not layer.pieces:
        raise FeatureError(f"{layer.file}: no rows; every sample needs activations.")
    dtype = np.asarray(layer.pieces[0][:0]).dtype
    shape = (len(layer), *layer.shape)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        for piece in layer.pieces:
            f.write(memoryview(np.ascontiguousarray(piece, dtype=dtype)).cast("B"))
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
