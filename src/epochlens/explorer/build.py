"""Build the explorer folder (``results/{run}/samples/explorer/``) from a run's dossier.

What the page loads, all static files (a plain file server serves them; nothing from the network)::

    index.html, explorer.js, explorer.css    the page (package data, epochlens/explorer/static)
    manifest.json                            the run, its columns, the layout of the chunks, the ROCs
    columns/{k}.bin                          one scalar column: float32, or uint8/uint16 category codes
    chunks/{c}.bin                           rows [c*C, (c+1)*C): per row, float32 scalars, series and
                                             neighbours (manifest "layout"), read when a row is opened
    chunks/{c}.json                          the same rows' strings (id, text, image)
    thumbs/...                               the thumbnail sheets the dossier names (image runs)

The page loads the manifest and the columns it draws (typed arrays, no parsing), and a chunk when a
sample is opened or shown in the table: at a million samples it moves 4 bytes per sample per column
drawn, not the whole dossier.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from epochlens.errors import DataError
from epochlens.explorer import columns as cols
from epochlens.explorer.roc import detector_columns, detector_rocs

STATIC = Path(__file__).parent / "static"
ASSETS = ("index.html", "explorer.css", "explorer.js", "plot.js", "panel.js", "main.js")
#: Bytes of one row chunk (chunks/{c}.bin) the page fetches to open a sample.
CHUNK_BYTES = 1 << 20


def read_dossier(path: str | Path) -> tuple[pa.Table, dict]:
    """The dossier table and its ``epochlens`` metadata, or a DataError naming the file and the fix."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no dossier; build it with snakemake {path} (rule sample_dossier) first")
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(b"epochlens")
    if raw is None:
        raise DataError(f"{path}: parquet without the 'epochlens' metadata: not a dossier; rebuild it")
    meta = json.loads(raw)
    missing = [k for k in cols.KEY if k not in table.column_names]
    if missing:
        raise DataError(f"{path}: dossier without the key column(s) {missing}; rebuild it")
    return table, meta


def _classify(table: pa.Table, n_epochs: int) -> dict:
    names = table.column_names
    nb_specs = cols.neighbour_columns(names)
    nb_names = {n for spec in nb_specs for n in spec[:2]}
    scalars, series, strings = [], [], []
    for name in names:
        t = table.schema.field(name).type
        if name == "epochs" or name in nb_names:
            continue
        if cols.is_list(t) and name in cols.VALUE_LISTS:
            strings.append(name)
        elif cols.is_list(t):
            series.append((name, cols.series(name, table.column(name), n_epochs)))
        elif (s := cols.scalar(name, table.column(name))) is not None:
            scalars.append(s)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            strings.append(name)
    return {"scalars": scalars, "series": series, "strings": strings, "neighbour_specs": nb_specs}


def _neighbours(table: pa.Table, specs: list) -> list[cols.Neighbours]:
    if not specs:  # no influence neighbours: no row lookup
        return []
    key = tuple(np.asarray(table.column(k).to_numpy(zero_copy_only=False)) for k in cols.KEY)
    key = (key[0].astype(np.int64), key[1].astype(str), key[2].astype(np.int64))
    lookup = cols.row_lookup(*key)
    return [cols.neighbours(table, spec, lookup, key) for spec in specs]


def _write_columns(out: Path, scalars: list[cols.Scalar]) -> list[dict]:
    (out / "columns").mkdir()
    entries = []
    for k, s in enumerate(scalars):
        s.values.tofile(out / "columns" / f"{k}.bin")
        entry = {"name": s.name, "kind": s.kind, "file": f"columns/{k}.bin", "dtype": s.values.dtype.name}
        if s.kind == "number":
            finite = s.values[np.isfinite(s.values)]
            entry["min"] = float(finite.min()) if len(finite) else None
            entry["max"] = float(finite.max()) if len(finite) else None
        else:
            entry["categories"] = s.categories
            entry["null"] = s.null_code
        entries.append(entry)
    return entries


def _chunk_layout(parts: dict, nbs: list[cols.Neighbours], n_epochs: int) -> dict:
    offset = len(parts["scalars"])
    series = []
    for name, _ in parts["series"]:
        series.append({"name": name, "offset": offset})
        offset += n_epochs
    neighbours = []
    for nb in nbs:
        k = nb.rows.shape[1]
        neighbours.append({"name": nb.name, "scores": nb.scores, "role": nb.role, "offset": offset, "k": k})
        offset += 2 * k
    return {
        "width": offset,
        "scalars": [s.name for s in parts["scalars"]],
        "series": series,
        "neighbours": neighbours,
    }


def _row_block(parts: dict, nbs: list[cols.Neighbours], lo: int, hi: int) -> np.ndarray:
    blocks = []
    for s in parts["scalars"]:
        v = s.values[lo:hi].astype(np.float32)
        if s.null_code is not None:
            v[s.values[lo:hi] == s.null_code] = np.nan
        blocks.append(v[:, None])
    blocks += [m[lo:hi] for _, m in parts["series"]]
    for nb in nbs:
        blocks += [nb.rows[lo:hi], nb.values[lo:hi]]
    return np.ascontiguousarray(np.hstack(blocks), dtype=np.float32)


def _write_chunks(out: Path, table: pa.Table, parts: dict, nbs: list, width: int) -> int:
    n = table.num_rows
    size = int(np.clip(2 ** round(np.log2(CHUNK_BYTES / (4 * width))), 256, 65536))
    (out / "chunks").mkdir()
    for c, lo in enumerate(range(0, n, size)):  # a chunk's text at a time: a Python str per value
        _row_block(parts, nbs, lo, min(n, lo + size)).tofile(out / "chunks" / f"{c}.bin")
        text = {name: cols.text_values(table.column(name).slice(lo, size)) for name in parts["strings"]}
        (out / "chunks" / f"{c}.json").write_text(json.dumps(text, separators=(",", ":")))
    return size


def _copy_thumbs(out: Path, dossier: Path, table: pa.Table) -> None:
    if "image" not in table.column_names:
        return
    sheets = pc.unique(pc.replace_substring_regex(table.column("image"), "#.*$", ""))  # few files
    for rel in sorted(rel for rel in sheets.to_pylist() if rel):  # a sheet once, whatever it holds
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise DataError(f"{dossier}: image path {rel!r} is not relative to the dossier's folder")
        src, dst = dossier.parent / rel, out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _rocs(table: pa.Table, scalars: list[cols.Scalar]) -> dict:
    names = [s.name for s in scalars if s.kind == "number"]
    scores = {
        n: pc.cast(table.column(n), pa.float64()).to_numpy(zero_copy_only=False)
        for n in detector_columns(names)
    }
    truth = None
    if "is_corrupted" in table.column_names:
        truth = pc.fill_null(pc.cast(table.column("is_corrupted"), pa.int8()), -1).to_numpy()
    train = pc.equal(table.column("role"), "train").to_numpy(zero_copy_only=False)
    if "split" in table.column_names:  # the holdout is not trained on
        train &= pc.fill_null(pc.equal(table.column("split"), "train"), False).to_numpy(zero_copy_only=False)
    return detector_rocs(scores, truth, np.asarray(train, bool))


def _class_names(table: pa.Table) -> dict[str, str]:
    """{label: label_name} from the rows that have both (the panel names the predicted class)."""
    if not {"label", "label_name"} <= set(table.column_names):
        return {}
    pairs = (
        pa.table({"l": table.column("label"), "n": table.column("label_name")})
        .group_by(["l", "n"])
        .aggregate([])
    )
    labels, names = pairs["l"].to_pylist(), pairs["n"].to_pylist()
    return {str(k): v for k, v in zip(labels, names, strict=True) if k is not None}


def _default_view(scalars: list[cols.Scalar]) -> dict:
    """The data map (variability x confidence; a regression's error variability x mean error),
    coloured by the ground truth, else correctness; the training rows."""
    numbers = [s.name for s in scalars if s.kind == "number"]
    names = {s.name for s in scalars}
    x = next((c for c in ("variability", "error_variability") if c in names), numbers[0])
    y = next((c for c in ("confidence", "error_mean") if c in names), numbers[min(1, len(numbers) - 1)])
    color = next((c for c in ("is_corrupted", "correctness", "label") if c in names), y)
    return {"x": x, "y": y, "color": color, "filters": {"role": ["train"]} if "role" in names else {}}


def _write_folder(out: Path, dossier: Path, table: pa.Table, meta: dict, parts: dict, nbs: list) -> dict:
    epochs = [int(e) for e in meta.get("epochs") or []]
    layout = _chunk_layout(parts, nbs, len(epochs))
    manifest = {
        "version": 1,
        "run": meta.get("run"),
        "task": meta.get("task"),
        "epochs": epochs,
        "n_rows": table.num_rows,
        "columns": _write_columns(out, parts["scalars"]),
        "strings": parts["strings"],
        "layout": layout,
        "chunk_size": _write_chunks(out, table, parts, nbs, layout["width"]),
        "roc": _rocs(table, parts["scalars"]),
        "descriptions": meta.get("columns", {}),
        "class_names": _class_names(table),
        "default": _default_view(parts["scalars"]),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    _copy_thumbs(out, dossier, table)
    for name in ASSETS:
        shutil.copy2(STATIC / name, out / name)
    return manifest


def build_explorer(dossier: str | Path, out: str | Path) -> dict:
    """Write the explorer of ``dossier`` into ``out`` (replaced whole, never half written) and
    return its manifest."""
    dossier, out = Path(dossier), Path(out)
    table, meta = read_dossier(dossier)
    epochs = [int(e) for e in meta.get("epochs") or []]
    parts = _classify(table, len(epochs))
    if not any(s.kind == "number" for s in parts["scalars"]):
        raise DataError(f"{dossier}: no numeric column to plot; rebuild the dossier")
    nbs = _neighbours(table, parts["neighbour_specs"])
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        manifest = _write_folder(partial, dossier, table, meta, parts, nbs)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return manifest
