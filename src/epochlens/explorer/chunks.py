"""The explorer's row chunks (``chunks/{c}.bin`` and ``chunks/{c}.json``), written from the dossier a
chunk of rows at a time: the rows read from the parquet file by row groups, the scalars read back
from the ``columns/{k}.bin`` files already written, so that no column is held whole but the
key the neighbour lists are resolved with."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from epochlens.explorer import columns as cols

#: Bytes of one row chunk (chunks/{c}.bin) the page fetches to open a sample.
CHUNK_BYTES = 1 << 20


@dataclass
class Plan:
    """What the explorer takes from each column: scalars (their ``columns/{k}.bin`` entries),
    series, strings, neighbour lists (positions, scores, role named, values a row)."""

    n_rows: int
    n_epochs: int
    scalars: list[dict] = field(default_factory=list)
    series: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    neighbours: list[tuple[str, str, str, int]] = field(default_factory=list)

    def layout(self) -> dict:
        """Where each scalar, series and neighbour list sits in a chunk's row of float32."""
        offset = len(self.scalars)
        series = []
        for name in self.series:
            series.append({"name": name, "offset": offset})
            offset += self.n_epochs
        neighbours = []
        for name, scores, role, k in self.neighbours:
            neighbours.append({"name": name, "scores": scores, "role": role, "offset": offset, "k": k})
            offset += 2 * k
        scalars = [s["name"] for s in self.scalars]
        return {"width": offset, "scalars": scalars, "series": series, "neighbours": neighbours}

    def chunk_size(self) -> int:
        """Rows a chunk: a power of two near :data:`CHUNK_BYTES`, from 256 to 65,536."""
        return int(np.clip(2 ** round(np.log2(CHUNK_BYTES / (4 * self.layout()["width"]))), 256, 65536))


def longest(column: pa.ChunkedArray | pa.Array) -> int:
    """The most values a row of a list column holds (0 for none)."""
    return int(pc.max(pc.list_value_length(column)).as_py() or 0)


def row_chunks(file: pq.ParquetFile, columns: list[str], size: int) -> Iterator[pa.Table]:
    """``columns`` of the file's rows, ``size`` rows at a time (the last fewer), row group by row group."""
    held: list[pa.Table] = []
    rows = 0
    for group in range(file.num_row_groups):
        held.append(file.read_row_group(group, columns=columns))
        rows += held[-1].num_rows
        while rows >= size:
            table = pa.concat_tables(held)
            yield table.slice(0, size)
            held, rows = [table.slice(size)], rows - size
    if rows:
        yield pa.concat_tables(held)


def write_chunks(out: Path, file: pq.ParquetFile, plan: Plan, lookup: dict, index: np.ndarray) -> set[str]:
    """Write every row chunk of the dossier; return the thumbnail sheets its ``image`` column names."""
    size, sheets = plan.chunk_size(), set()
    names = [*plan.series, *plan.strings, *[c for spec in plan.neighbours for c in spec[:2]]]
    (out / "chunks").mkdir()
    for c, chunk in enumerate(row_chunks(file, list(dict.fromkeys(names)), size)):
        lo, hi = c * size, c * size + chunk.num_rows
        _row_block(out, plan, chunk, lookup, index[lo:hi] if len(index) else index, lo).tofile(
            out / "chunks" / f"{c}.bin"
        )
        text = {name: cols.text_values(chunk.column(name)) for name in plan.strings}
        (out / "chunks" / f"{c}.json").write_text(json.dumps(text, separators=(",", ":")))
        if "image" in chunk.column_names:
            sheets.update(pc.unique(pc.replace_substring_regex(chunk["image"], "#.*$", "")).to_pylist())
    return {rel for rel in sheets if rel}


def _row_block(
    out: Path, plan: Plan, chunk: pa.Table, lookup: dict, index: np.ndarray, lo: int
) -> np.ndarray:
    """The chunk's rows as float32: scalars (categories' null code as NaN), series, neighbours."""
    blocks = []
    for entry in plan.scalars:
        dtype = np.dtype(entry["dtype"])
        stored = np.fromfile(out / entry["file"], dtype, count=chunk.num_rows, offset=lo * dtype.itemsize)
        values = stored.astype(np.float32)
        if entry["kind"] == "category":
            values[stored == entry["null"]] = np.nan
        blocks.append(values[:, None])
    blocks += [cols.series(name, chunk.column(name), plan.n_epochs, lo) for name in plan.series]
    for name, scores, role, k in plan.neighbours:
        nb = cols.neighbours(chunk, (name, scores, role), lookup, index, k)
        blocks += [nb.rows, nb.values]
    return np.ascontiguousarray(np.hstack(blocks), dtype=np.float32)
