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
from epochlens.explorer.chunks import Plan, longest, write_chunks
from epochlens.explorer.roc import detector_columns, detector_rocs

STATIC = Path(__file__).parent / "static"
ASSETS = ("index.html", "explorer.css", "explorer.js", "plot.js", "panel.js", "main.js")


def read_dossier(path: str | Path) -> tuple[pq.ParquetFile, dict]:
    """The dossier (opened: its rows are read by columns and row groups) and its ``epochlens``
    metadata, or a DataError naming the file and the fix."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no dossier; build it with snakemake {path} (rule sample_dossier) first")
    file = pq.ParquetFile(path)
    raw = (file.schema_arrow.metadata or {}).get(b"epochlens")
    if raw is None:
        raise DataError(f"{path}: parquet without the 'epochlens' metadata: not a dossier; rebuild it")
    meta = json.loads(raw)
    missing = [k for k in cols.KEY if k not in file.schema_arrow.names]
    if missing:
        raise DataError(f"{path}: dossier without the key column(s) {missing}; rebuild it")
    return file, meta


def _plan(out: Path, file: pq.ParquetFile, n_epochs: int) -> Plan:
    """Each column's part in the explorer, a column read at a time; the scalars' files written."""
    schema = file.schema_arrow
    plan = Plan(file.metadata.num_rows, n_epochs)
    specs = cols.neighbour_columns(schema.names)
    listed = {n for spec in specs for n in spec[:2]}
    plan.neighbours = [(*spec, longest(file.read(columns=[spec[0]])[spec[0]])) for spec in specs]
    (out / "columns").mkdir()
    for name in schema.names:
        t = schema.field(name).type
        if name == "epochs" or name in listed:
            continue
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        if cols.is_list(t):
            (plan.strings if name in cols.VALUE_LISTS else plan.series).append(name)
        elif text and name in cols.STRINGS:  # never a category: not read here
            plan.strings.append(name)
        elif (s := cols.scalar(name, file.read(columns=[name])[name])) is not None:
            plan.scalars.append(_write_column(out, len(plan.scalars), s))
        elif text:
            plan.strings.append(name)
    return plan


def _write_column(out: Path, k: int, s: cols.Scalar) -> dict:
    """Write a scalar's values as ``columns/{k}.bin``; its manifest entry."""
    s.values.tofile(out / "columns" / f"{k}.bin")
    entry = {"name": s.name, "kind": s.kind, "file": f"columns/{k}.bin", "dtype": s.values.dtype.name}
    if s.kind == "number":
        finite = s.values[np.isfinite(s.values)]
        entry["min"] = float(finite.min()) if len(finite) else None
        entry["max"] = float(finite.max()) if len(finite) else None
    else:
        entry["categories"] = s.categories
        entry["null"] = s.null_code
    return entry


def _neighbour_rows(file: pq.ParquetFile, plan: Plan) -> tuple[dict, np.ndarray]:
    """The row of each (index, role, position) and every row's index, where there are neighbour
    lists to resolve (none: no lookup, no key read)."""
    if not plan.neighbours:
        return {}, np.zeros(0, np.int64)
    key = file.read(columns=list(cols.KEY))
    index, role, position = (np.asarray(key[k].to_numpy(zero_copy_only=False)) for k in cols.KEY)
    index, position = index.astype(np.int64), position.astype(np.int64)
    return cols.row_lookup(index, role.astype(str), position), index


def _copy_thumbs(out: Path, dossier: Path, sheets: set[str]) -> None:
    for rel in sorted(sheets):  # a sheet once, whatever it holds
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise DataError(f"{dossier}: image path {rel!r} is not relative to the dossier's folder")
        src, dst = dossier.parent / rel, out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _rocs(file: pq.ParquetFile, scalars: list[dict]) -> dict:
    """The detectors' ROCs: without ground truth none (nothing read); else the truth and the
    trained rows a row group at a time (a byte a row), each detector's scores a column at a time."""
    names = set(file.schema_arrow.names)
    if "is_corrupted" not in names:
        return detector_rocs({}, None, np.zeros(0, bool))
    truth, train = [], []
    for group in range(file.num_row_groups):
        rows = file.read_row_group(
            group, columns=[c for c in ("is_corrupted", "role", "split") if c in names]
        )
        truth.append(pc.fill_null(pc.cast(rows["is_corrupted"], pa.int8()), -1).to_numpy())
        trained = pc.equal(rows["role"], "train").to_numpy(zero_copy_only=False)
        if "split" in names:  # the holdout is not trained on
            trained &= pc.fill_null(pc.equal(rows["split"], "train"), False).to_numpy(zero_copy_only=False)
        train.append(trained)
    detectors = detector_columns([s["name"] for s in scalars if s["kind"] == "number"])
    scores = {
        n: pc.cast(file.read(columns=[n])[n], pa.float64()).to_numpy(zero_copy_only=False) for n in detectors
    }
    if not truth:  # a dossier of no rows
        return detector_rocs(scores, np.zeros(0, np.int8), np.zeros(0, bool))
    return detector_rocs(scores, np.concatenate(truth), np.asarray(np.concatenate(train), bool))


def _class_names(file: pq.ParquetFile) -> dict[str, str]:
    """{label: label_name} from the rows that have both (the panel names the predicted class)."""
    if not {"label", "label_name"} <= set(file.schema_arrow.names):
        return {}
    found = {}
    for group in range(file.num_row_groups):  # a few pairs a row group, in the order they appear
        rows = file.read_row_group(group, columns=["label", "label_name"])
        pairs = rows.group_by(["label", "label_name"]).aggregate([])
        found.update(zip(pairs["label"].to_pylist(), pairs["label_name"].to_pylist(), strict=True))
    return {str(k): found[k] for k in sorted(k for k in found if k is not None)}  # in label order


def _default_view(scalars: list[dict]) -> dict:
    """The data map (variability x confidence; a regression's error variability x mean error),
    coloured by the ground truth, else correctness; the training rows."""
    numbers = [s["name"] for s in scalars if s["kind"] == "number"]
    names = {s["name"] for s in scalars}
    x = next((c for c in ("variability", "error_variability") if c in names), numbers[0])
    y = next((c for c in ("confidence", "error_mean") if c in names), numbers[min(1, len(numbers) - 1)])
    color = next((c for c in ("is_corrupted", "correctness", "label") if c in names), y)
    return {"x": x, "y": y, "color": color, "filters": {"role": ["train"]} if "role" in names else {}}


def _write_folder(out: Path, dossier: Path, file: pq.ParquetFile, meta: dict) -> dict:
    epochs = [int(e) for e in meta.get("epochs") or []]
    plan = _plan(out, file, len(epochs))
    if not any(s["kind"] == "number" for s in plan.scalars):
        raise DataError(f"{dossier}: no numeric column to plot; rebuild the dossier")
    sheets = write_chunks(out, file, plan, *_neighbour_rows(file, plan))
    manifest = {
        "version": 1,
        "run": meta.get("run"),
        "task": meta.get("task"),
        "epochs": epochs,
        "n_rows": plan.n_rows,
        "columns": plan.scalars,
        "strings": plan.strings,
        "layout": plan.layout(),
        "chunk_size": plan.chunk_size(),
        "roc": _rocs(file, plan.scalars),
        "descriptions": meta.get("columns", {}),
        "class_names": _class_names(file),
        "default": _default_view(plan.scalars),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    _copy_thumbs(out, dossier, sheets)
    for name in ASSETS:
        shutil.copy2(STATIC / name, out / name)
    return manifest


def build_explorer(dossier: str | Path, out: str | Path) -> dict:
    """Write the explorer of ``dossier`` into ``out`` (replaced whole, never half written) and
    return its manifest. The dossier is read a column or a chunk of rows at a time."""
    dossier, out = Path(dossier), Path(out)
    file, meta = read_dossier(dossier)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        manifest = _write_folder(partial, dossier, file, meta)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return manifest
