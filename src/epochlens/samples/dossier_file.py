"""The dossier written to ``samples/dossier.parquet`` a row group at a time, never whole
(:func:`write_dossier`): each group of :func:`~epochlens.samples.dossier.dossier_pieces` (an
index's training rows, its queries) to a part file of its own schema, then every part's row
groups, given the columns of all, into the dossier."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from epochlens.atomic import orphan_tag, write_atomic
from epochlens.samples.dossier import DossierInputs, dossier_metadata, dossier_pieces


def write_dossier(inputs: DossierInputs, path: str | Path) -> dict[str, int]:
    """Build the dossier and write it atomically as zstd-compressed parquet, a row group per
    table of :func:`dossier_pieces`, never whole: each group is written to a part file first (its
    own schema), then every part's row groups, given the columns of all (the others' null), into
    the dossier. Returns its rows per role and its columns (``"columns"``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts: list[Path] = []  # named as atomic's temporaries: a killed job's are removed by the next
    try:
        for k, group in enumerate(dossier_pieces(inputs)):
            parts.append(path.with_name(f".{path.name}.{orphan_tag()}part{k}"))
            if not write_part(parts[-1], group):
                parts.pop()
        schema = pa.unify_schemas([pq.read_schema(part) for part in parts], promote_options="default")
        meta = json.dumps(dossier_metadata(inputs, schema.names)).encode()
        schema = schema.with_metadata({b"epochlens": meta})
        counts = {}
        write_atomic(path, lambda tmp: counts.update(join_parts(parts, schema, tmp)))
    finally:
        for part in parts:
            part.unlink(missing_ok=True)
    return {**counts, "columns": len(schema)}


def write_part(path: Path, tables: Iterator[pa.Table]) -> bool:
    """Write tables of one schema as a parquet file, a row group each; False if there were none."""
    writer = None
    for table in tables:
        writer = writer or pq.ParquetWriter(path, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=max(1, table.num_rows))
    if writer is not None:
        writer.close()
    return writer is not None


def join_parts(parts: list[Path], schema: pa.Schema, path: str | Path) -> dict[str, int]:
    """The row groups of ``parts`` in order, each given ``schema``'s columns, as one parquet file;
    returns the rows per role."""
    counts: dict[str, int] = {}
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for part in parts:
            file = pq.ParquetFile(part)
            for group in range(file.num_row_groups):
                table = file.read_row_group(group)
                n, names = table.num_rows, table.column_names
                columns = [table[f.name] if f.name in names else pa.nulls(n, f.type) for f in schema]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema), row_group_size=max(1, n))
                for row in pc.value_counts(table["role"]).to_pylist():
                    counts[row["values"]] = counts.get(row["values"], 0) + row["counts"]
    return counts
