"""Features from stored activations: the user's files instead of a model's hooks.

A snapshot folder (one per "epoch", ``checkpoints.path`` with ``{epoch}``) holds every layer's
activations of each split's samples, in one of these layouts (``format: auto`` finds which):

* ``save_to_disk``: a Hugging Face ``DatasetDict.save_to_disk`` folder with splits ``train`` and
  ``test``, one column per layer (a list, ``Sequence`` or ``Array2D``/``Array3D`` per row);
* ``parquet``: ``train.parquet`` and ``test.parquet`` (or ``train/*.parquet``), one column per layer;
* ``npy``: ``train/<layer>.npy`` and ``test/<layer>.npy``, (N, *shape) each;
* ``safetensors``: ``train/<layer>.safetensors`` and ``test/...``, one tensor (N, *shape) each.

Rows are the split's samples in the run's data order, or in any order with ``id_column`` (a column,
or ``<id_column>.npy`` / ``.safetensors``) giving each row's position in the split; a count or id
mismatch is an error naming the layer's file. A layer is read at a time: a ``save_to_disk``
column by ``pread`` of its buffers at the offsets that Arrow's zero-copy views of the
memory-mapped files give, into one reused buffer (large sequential reads; the mapping's own page
faults made reading 0.79x a plain read of the files), a ``.npy`` or ``.safetensors`` file the same
way after its header, a parquet column decoded alone from files opened once per split; the
representations (:mod:`epochlens.features.stored_representations`) run on batches of
``batch_size`` rows.

The output is the features file of :mod:`epochlens.features.cache` (same layout and attributes), so
probes, tables and figures read it unchanged. Its cache key hashes the snapshot's fingerprint (each
file's relative path, size and modification time), the data key and
:meth:`StoredFeatureSettings.spec` (user representations with their source files' hash).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from epochlens.atomic_hdf5 import atomic_h5
from epochlens.errors import FeatureError
from epochlens.features import stored_representations as srep
from epochlens.features.cache import CacheResult, cached_or_written, file_attrs
from epochlens.features.stored_columns import file_columns, resolve_layers, split_columns
from epochlens.features.stored_files import (  # noqa: F401 (moved there; importable here too)
    SAFETENSORS_DTYPES,
    BFloat16Rows,
    ReusedBuffer,
    pread_into,
    read_npy,
    read_safetensors,
)
from epochlens.features.stored_settings import StoredFeatureSettings, detect_format
from epochlens.progress import progress_bar

log = logging.getLogger("epochlens")

ARROW_FORMATS = ("save_to_disk", "parquet")


# ---------------------------------------------------------------------------------------------
# A layer's rows


class LayerArray:
    """One layer of one split: (N, *shape) rows in pieces (numpy arrays, memory maps or
    :class:`~epochlens.features.stored_files.BFloat16Rows`), read by :meth:`rows` or :meth:`take`
    without loading the rest."""

    def __init__(self, pieces: list, shape: tuple[int, ...], file: str) -> None:
        self.pieces, self.shape, self.file = pieces, tuple(shape), file
        self.starts = np.cumsum([0] + [len(p) for p in pieces])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows lo..hi (a view where they lie in one piece)."""
        parts = []
        for i, piece in enumerate(self.pieces):
            a, b = max(lo, self.starts[i]), min(hi, self.starts[i + 1])
            if a < b:
                parts.append(np.asarray(piece[a - self.starts[i] : b - self.starts[i]]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def take(self, index: np.ndarray) -> np.ndarray:
        """Rows at ``index`` (any order)."""
        out = None
        for i, piece in enumerate(self.pieces):
            inside = (index >= self.starts[i]) & (index < self.starts[i + 1])
            if inside.any():
                values = np.asarray(piece[index[inside] - self.starts[i]])
                if out is None:
                    out = np.empty((len(index), *values.shape[1:]), dtype=values.dtype)
                out[inside] = values
        assert out is not None
        return out


def arrow_numpy(chunk, where: str) -> np.ndarray:
    """A zero-copy numpy view (rows, *shape) of an Arrow array of equal-length (nested) lists.

    Each level's values are sliced to the rows' range (what ``flatten`` gives without nulls) rather
    than taken by ``flatten``, a compute call: this runs for every chunk of every layer, and the
    compute calls cost a tenth of a layer's read."""
    import pyarrow as pa

    arr = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
    shape: list[int] = []
    while isinstance(arr, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        if arr.null_count:
            raise FeatureError(f"{where}: {arr.null_count} rows are null; every sample needs activations.")
        if isinstance(arr, pa.FixedSizeListArray):
            width = arr.type.list_size
            arr = arr.values.slice(arr.offset * width, len(arr) * width)
        else:
            offsets = arr.offsets.to_numpy()
            lengths = np.diff(offsets)
            if len(lengths) and (lengths != lengths[0]).any():
                raise FeatureError(
                    f"{where}: rows of different lengths ({sorted(set(lengths.tolist()))[:5]}); a "
                    "layer's activations have one shape (pad them before storing)."
                )
            width = int(lengths[0]) if len(lengths) else 0
            arr = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        shape.append(width)
    if arr.null_count or not (pa.types.is_floating(arr.type) or pa.types.is_integer(arr.type)):
        raise FeatureError(f"{where}: values of type {arr.type} (with nulls?); store float arrays.")
    return arr.to_numpy(zero_copy_only=True).reshape(len(chunk), *shape)


# ---------------------------------------------------------------------------------------------
# A snapshot folder


class Snapshot:
    """Read access to one snapshot folder, a layer at a time (module doc)."""

    def __init__(self, folder: str | Path, file_format: str = "auto", id_column: str | None = None) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FeatureError(f"{self.folder}: no such snapshot folder; check checkpoints.path.")
        self.format = detect_format(self.folder) if file_format == "auto" else file_format
        self.id_column = id_column
        self._tables: dict[str, ArrowSplit | ParquetSplit] = {}
        self._buffers: dict[str, ReusedBuffer] = {}  # a split's .npy/.safetensors layer (Arrow: its own)
        # looked up once per split, not per layer (a glob of 128 files cost a quarter of a layer's read)
        self._paths: dict[str, Path] = {}
        self._names: dict[str, list[str]] = {}
        self._others: dict[str, list[str]] = {}

    def _split_path(self, split: str) -> Path:
        if split not in self._paths:
            self._paths[split] = self._find_split(split)
        return self._paths[split]

    def _find_split(self, split: str) -> Path:
        if self.format == "parquet" and (self.folder / f"{split}.parquet").exists():
            return self.folder / f"{split}.parquet"
        path = self.folder / split
        if not path.exists():
            layout = (
                "a DatasetDict with splits train and test" if self.format == "save_to_disk" else split + "/"
            )
            raise FeatureError(f"{path}: the snapshot has no {split} split ({self.format} layout: {layout}).")
        return path

    def _arrow(self, split: str) -> ArrowSplit | ParquetSplit:
        if split not in self._tables:
            kind = ArrowSplit if self.format == "save_to_disk" else ParquetSplit
            self._tables[split] = kind(self._split_path(split))
        return self._tables[split]

    def layers(self, split: str) -> list[str]:
        """Layer names of ``split`` in stored order (files: natural sort), the id column left out."""
        if split not in self._names:
            if self.format in ARROW_FORMATS:  # columns of scalars (a label) are not layers
                names, self._others[split] = split_columns(self._arrow(split).schema, self.id_column)
            else:  # files of one value per row (N,) are not layers
                names, self._others[split] = file_columns(
                    self._split_path(split), self.format, self.id_column
                )
            self._names[split] = names
        return list(self._names[split])

    def other_columns(self, split: str) -> list[str]:
        """The columns of ``split`` that are not activations (a label, a text), left out of the layers."""
        self.layers(split)
        return list(self._others[split])

    def file(self, split: str, layer: str) -> str:
        """The file (or folder) a layer is read from, for messages."""
        path = self._split_path(split)
        return str(path if self.format in ARROW_FORMATS else path / f"{layer}.{self.format}")

    def layer(self, split: str, layer: str) -> LayerArray:
        """One layer of ``split`` (N, *shape) (a ``save_to_disk``, ``.npy`` or ``.safetensors``
        layer: read into a buffer that the split's next layer reuses; parquet: decoded by Arrow)."""
        where = f"{self.file(split, layer)} (layer {layer!r})"
        if layer not in self.layers(split) and layer != self.id_column:
            raise FeatureError(
                f"{where}: no such layer; the snapshot's {split} split has {self.layers(split)[:40]}. "
                "Fix features.layers or store the layer."
            )
        reuse = layer != self.id_column  # the ids are kept while the layers are read
        if self.format in ARROW_FORMATS:
            pieces = self._arrow(split).read_column(layer, where, reuse=reuse)
        else:
            read = read_npy if self.format == "npy" else read_safetensors
            buffer = self._buffers.setdefault(split, ReusedBuffer())
            pieces = [read(Path(self.file(split, layer)), where, buffer, reuse)]
        pieces = [p for p in pieces if len(p)]
        shape = tuple(pieces[0].shape[1:]) if pieces else ()
        return LayerArray(pieces, shape, where)

    def order(self, split: str, n: int) -> np.ndarray | None:
        """Row of each sample 0..n-1 of the split (None: rows are in order), from ``id_column``."""
        if self.id_column is None:
            return None
        ids = self.layer(split, self.id_column)
        values = ids.rows(0, len(ids)).reshape(len(ids), -1)[:, 0].astype(np.int64)
        if len(values) != n or not np.array_equal(np.sort(values), np.arange(n)):
            missing = np.setdiff1d(np.arange(n), values)[:10].tolist()
            raise FeatureError(
                f"{ids.file}: id column {self.id_column!r} holds {len(values)} ids, not the positions "
                f"0..{n - 1} of the run's {n} {split} samples once each (missing e.g. {missing}). "
                "Store each row's position in the split, or leave id_column out for rows in order."
            )
        return np.argsort(values, kind="stable")

    def fingerprint(self) -> str:
        """SHA-256 of each file's relative path, size and modification time."""
        entries = sorted(
            (str(p.relative_to(self.folder)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.folder.rglob("*")
            if p.is_file()
        )
        return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


class ArrowSplit:
    """One split of a ``save_to_disk`` folder: its Arrow files (``state.json``'s ``_data_files``),
    memory-mapped for their metadata; a layer's values are read with ``pread`` from the offsets of
    its column's buffers in each file (large sequential reads, no page faults of a mapping)."""

    def __init__(self, folder: Path) -> None:
        import pyarrow as pa

        try:
            state = json.loads((folder / "state.json").read_text())
            self.files = [folder / entry["filename"] for entry in state["_data_files"]]
        except (OSError, KeyError, ValueError) as exc:
            raise FeatureError(
                f"{folder}: not a save_to_disk split ({type(exc).__name__}: {exc}); write it with "
                "DatasetDict.save_to_disk."
            ) from exc
        self.tables, self.bases = [], []
        self._buffer = ReusedBuffer()
        # open while the split is: opening each file for each layer cost ~2% of the read
        self._handles = [open(path, "rb", buffering=0) for path in self.files]  # noqa: SIM115
        for path in self.files:
            mapped = pa.memory_map(str(path))
            self.bases.append(mapped.read_buffer(1).address)
            mapped.seek(0)
            self.tables.append(pa.ipc.open_stream(mapped).read_all())

    @property
    def schema(self):
        """The split's Arrow schema (its first file's)."""
        return self.tables[0].schema

    def read_column(self, name: str, where: str, reuse: bool = False) -> list[np.ndarray]:
        """The column's rows (n, *shape), read into memory: one array over every file and chunk
        where they share a dtype and row shape (a batch across two files is a view, not a copy:
        copying those cost a third of a layer's read), else one per chunk; ``reuse``: into this
        split's one buffer (fresh memory costs a page fault per 4 KiB: 0.62x a plain read against
        0.8x), valid until the next such call."""
        views = [
            (handle.fileno(), base, v)
            for handle, base, table in zip(self._handles, self.bases, self.tables, strict=True)
            for v in (arrow_numpy(c, where) for c in table.column(name).chunks)
            if len(v)
        ]
        if not views:
            return []
        store = self._buffer.take(sum(v.nbytes for _, _, v in views), reuse)
        raw, start, out = memoryview(store), 0, []
        for fd, base, view in views:
            pread_into(fd, raw[start : start + view.nbytes], view.ctypes.data - base, view)
            out.append(store[start : start + view.nbytes].view(view.dtype).reshape(view.shape))
            start += view.nbytes
        first = out[0]
        if all(a.dtype == first.dtype and a.shape[1:] == first.shape[1:] for a in out):
            return [store.view(first.dtype).reshape(-1, *first.shape[1:])]
        return out


class ParquetSplit:
    """One split of a parquet snapshot (``<split>.parquet`` or ``<split>/*.parquet``): its files
    opened once (each footer parsed once, not per layer: the earlier ``ParquetDataset`` per layer read
    at 0.85-0.90x this in two interleaved runs); a layer's column is decoded alone by Arrow from
    each file, its rows zero-copy views of the decoded values. Arrow's decoding bounds the speed
    (README, "Probes on stored activations"): ``pre_buffer``, ``use_threads`` and row groups
    copied into a reused buffer were no faster, ``memory_map`` 1.00-1.07x (noise) and it keeps the
    pages mapped, so that ``posix_fadvise(DONTNEED)`` no longer drops them (the benchmark's cold
    read)."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        if not self.files:
            raise FeatureError(f"{path}: no .parquet files; store <split>.parquet or <split>/*.parquet.")
        self.handles = [pq.ParquetFile(str(f)) for f in self.files]

    @property
    def schema(self):
        """The split's Arrow schema (its first file's)."""
        return self.handles[0].schema_arrow

    def read_column(self, name: str, where: str, reuse: bool = False) -> list[np.ndarray]:
        """The column's rows (n, *shape), one array per file and chunk (``reuse``: unused, the
        decoded values are Arrow's own memory)."""
        out = []
        for path, handle in zip(self.files, self.handles, strict=True):
            if name not in handle.schema_arrow.names:
                raise FeatureError(
                    f"{path} (layer {name!r}): no such column, though {self.files[0].name} has it; "
                    "every file of a split needs the same columns."
                )
            table = handle.read(columns=[name], use_threads=False)
            out.extend(arrow_numpy(c, where) for c in table.column(0).chunks)
        return out


# ---------------------------------------------------------------------------------------------
# Features file


def stored_data_key(content_hash: str) -> str:
    """The data key of stored features: the run's data content hash (labels and inputs)."""
    return hashlib.sha256(json.dumps({"kind": "stored", "content_hash": content_hash}).encode()).hexdigest()


def layer_features(
    snapshot: Snapshot,
    split: str,
    layer: str,
    n: int,
    functions: dict[str, srep.Representation],
    batch_size: int,
) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """Every representation (n, d) float32 of one layer of ``split``, and its per-sample shape."""
    array = checked_layer(snapshot, split, layer, n)
    order = snapshot.order(split, n)
    out: dict[str, np.ndarray] = {}  # each batch written in place (no concatenation: a copy)
    for lo in range(0, n, batch_size):
        hi = min(lo + batch_size, n)
        rows = array.rows(lo, hi) if order is None else array.take(order[lo:hi])
        batch = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
        for name, fn in functions.items():
            width = out[name].shape[1] if name in out else None
            value = srep.checked(fn(batch), hi - lo, width, layer, name, snapshot.file(split, layer))
            if name not in out:
                out[name] = np.empty((n, value.shape[1]), dtype=np.float32)
            out[name][lo:hi] = value
    return out, array.shape


def checked_layer(snapshot: Snapshot, split: str, layer: str, n: int) -> LayerArray:
    """One layer of ``split``, checked to hold activations (N, *shape) of the run's ``n`` samples;
    else an error naming its file."""
    array = snapshot.layer(split, layer)
    if not array.shape:
        raise FeatureError(
            f"{array.file}: one number per row, not activations (N, *shape); list the layers in "
            "features.layers (or name this column in checkpoints.id_column if it holds the ids)."
        )
    if len(array) != n:
        raise FeatureError(
            f"{array.file}: {len(array)} rows, but the run's {split} split has {n} samples; store one "
            "row per sample (or check that the snapshot belongs to this run's data)."
        )
    return array


def write_stored_features(
    path: str | Path,
    snapshot: Snapshot,
    data,
    settings: StoredFeatureSettings,
    progress: bool = False,
) -> None:
    """Build the features file at ``path`` atomically from a snapshot (layout of
    :mod:`epochlens.features.cache`); ``data``: the run's data set (labels, sample counts)."""
    t0 = time.perf_counter()
    layers = selected_layers(snapshot, settings)
    functions = {name: srep.resolve(name, settings) for name in settings.representations}
    store = np.dtype(settings.dtype)
    fingerprint = snapshot.fingerprint()
    shapes: dict[str, tuple[int, ...]] = {}
    with atomic_h5(path) as f:
        for split in settings.splits:
            labels = np.asarray(data.labels(split))
            group = f.create_group(split)
            group.create_dataset(
                "labels", data=labels if np.issubdtype(labels.dtype, np.floating) else labels.astype(np.int64)
            )
            for layer in progress_bar(layers, desc=f"stored {split}", disable=not progress):
                feats, shape = layer_features(
                    snapshot, split, layer, len(labels), functions, settings.batch_size
                )
                if shapes.setdefault(layer, shape) != shape:
                    raise FeatureError(
                        f"{snapshot.file(split, layer)}: activations of shape {shape} per sample, but "
                        f"{shapes[layer]} in {snapshot.file(settings.splits[0], layer)}; every split "
                        "of a layer holds the same activations. Store the layer again."
                    )
                for name, values in feats.items():
                    _check_range(values, store, layer, name, snapshot.file(split, layer))
                    ds = group.create_dataset(f"{layer}/{name}", data=values.astype(store, copy=False))
                    ds.attrs["activation_shape"] = np.asarray(shape, dtype=np.int64)
        f.attrs.update(_file_attrs(snapshot, data, settings, layers, fingerprint, t0))


def selected_layers(snapshot: Snapshot, settings: StoredFeatureSettings) -> list[str]:
    """The layers ``settings`` asks for (names or patterns; None: every stored one), each checked
    to be stored (:func:`epochlens.features.stored_columns.resolve_layers`); the columns that are
    not activations are named in the log."""
    split = settings.splits[0]
    stored, others = snapshot.layers(split), snapshot.other_columns(split)
    if others:
        log.info(
            "%s: columns %s are not activations (one value per row): not layers", snapshot.folder, others
        )
    _check_columns_agree(snapshot, settings.splits)
    where = str(snapshot._split_path(split))
    return resolve_layers(stored, settings.layers, others, where)


def _check_columns_agree(snapshot: Snapshot, splits) -> None:
    """A name that is a layer (N, *shape) in one split and one value per row (N,) in another is
    a snapshot stored twice differently: refused, naming both files (it was left out silently)."""
    first = splits[0]
    for split in splits[1:]:
        for layer_split, column_split in ((first, split), (split, first)):
            both = sorted(set(snapshot.layers(layer_split)) & set(snapshot.other_columns(column_split)))
            if both:
                name = both[0]
                raise FeatureError(
                    f"{snapshot.file(column_split, name)}: one value per row, but "
                    f"{snapshot.file(layer_split, name)} holds activations (N, *shape) of the same "
                    f"name; every split stores a layer the same way. Store {name!r} again."
                )


def _check_range(values: np.ndarray, store: np.dtype, layer: str, name: str, file: str) -> None:
    if store == np.float16 and values.size and float(np.abs(values).max()) > float(np.finfo(np.float16).max):
        raise FeatureError(
            f"{file}: layer {layer!r} representation {name!r} exceeds the float16 range; set "
            "features.dtype: float32."
        )


def _file_attrs(snapshot, data, settings, layers, fingerprint, t0) -> dict:
    extra = dict(
        format_version=settings.spec()["format_version"],
        kind="stored",
        representations=settings.representations,
        snapshot=str(snapshot.folder),
        snapshot_format=snapshot.format,
    )
    dkey = stored_data_key(data.content_hash)
    return file_attrs(data, settings, fingerprint, dkey, layers, "", "cpu", t0, extra)


def load_or_build(
    path: str | Path,
    folder: str | Path,
    data,
    settings: StoredFeatureSettings,
    progress: bool = False,
) -> CacheResult:
    """The features of a snapshot from ``path`` if cached under the same key, else built and written."""
    snapshot = Snapshot(folder, settings.file_format, settings.id_column)
    dkey = stored_data_key(data.content_hash)

    def write(_: object) -> None:
        write_stored_features(path, snapshot, data, settings, progress)

    return cached_or_written(path, _no_model, snapshot.fingerprint(), dkey, settings.spec(), write)


def _no_model() -> None:
    """Stored features have no model to build."""


def iter_layers(snapshot: Snapshot, split: str) -> Iterator[tuple[str, LayerArray]]:
    """(name, rows) of every layer of ``split``, one at a time."""
    for name in snapshot.layers(split):
        yield name, snapshot.layer(split, name)
