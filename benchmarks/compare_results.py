"""Are two results/ trees of the workflow the same computation? Table for table, array for array.

Compares every table and array that both trees hold, and lists the files only one of them has:

* ``.npy``, ``.csv``: byte for byte (their bytes are their values);
* ``.parquet``: byte for byte, else column for column (schema and its metadata, then each
  column's values bit for bit, NaN equal to NaN): how rows are grouped in the file changes its
  bytes, not its values;
* ``.npz``: array for array (name, dtype, shape, values bit for bit): the zip container stamps each
  member with the time it was written; a member holding a JSON record is compared as JSON without
  the keys that record run time and code version (:data:`JSON_VOLATILE_KEYS`);
* ``.h5``: dataset for dataset (dtype, shape, values bit for bit) and every attribute but the ones
  that record when and how fast a file was written (:data:`H5_TIMING_ATTRS`);
* ``.pt``: byte for byte, else tensor for tensor (a state_dict or a dict holding tensors), without
  the keys that record run time (:data:`JSON_VOLATILE_KEYS`: influence factors' ``timings``).

Left out, and why:

* ``logs/`` and ``benchmarks/`` folders (``.log``, ``.tsv``): run times, process ids, paths of
  temporary script copies;
* ``.json`` (``metadata.json``, ``train_metadata.json``): provenance records (code version and
  hashes of the library's source files, which a refactoring changes by design), compute times and
  devices; the values they describe are in the arrays and tables compared here;
* ``.png``/``.pdf`` figures: drawn from the compared tables (matplotlib stamps PDFs with a creation
  date); their bytes are reported as information only.

Usage::

    python benchmarks/compare_results.py BASE/results NEW/results

Exit status 0 when every compared file is equal and both trees hold the same compared files
(``--produced-only``: every file of the new tree is in the base and equal to it).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

#: Folders of a run whose files record how a job ran, not what it computed.
EXCLUDED_FOLDERS = ("logs", "benchmarks")
#: Suffixes left out (see the module doc), and the figures reported as information only.
EXCLUDED_SUFFIXES = (".json", ".log", ".tsv")
FIGURES = (".png", ".pdf", ".svg")
#: Attributes of an .h5 file that record when it was written and how long it took.
H5_TIMING_ATTRS = ("created_utc", "compute_seconds")
#: Keys of the JSON records that some .npz files hold as a string member (a curvature shard's
#: ``header``, an LDS retraining's ``info``) that record how long a job took and which code ran it.
JSON_VOLATILE_KEYS = ("compute_time_seconds", "timings", "provenance")


def _kind(path: Path) -> str:
    if any(part in EXCLUDED_FOLDERS for part in path.parts[:-1]):
        return "excluded"
    suffix = path.suffix
    if suffix in EXCLUDED_SUFFIXES:
        return "excluded"
    if suffix in FIGURES:
        return "figure"
    return suffix.lstrip(".") or "other"


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (NaN equal to NaN in the same place)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "OUS" or a.dtype.names:
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()


def _npz(a: Path, b: Path) -> list[str]:
    with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
        if sorted(x.files) != sorted(y.files):
            return [f"members {sorted(x.files)} != {sorted(y.files)}"]
        return [f"array {k!r} differs" for k in x.files if not _members_equal(x[k], y[k])]


def _members_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "U" and a.shape == () and b.dtype.kind == "U" and b.shape == ():
        try:
            return _stable(json.loads(str(a))) == _stable(json.loads(str(b)))
        except ValueError:
            pass  # not JSON: compared as an array
    return _arrays_equal(a, b)


def _stable(record):
    """A JSON record without the keys that record run time and code version."""
    if isinstance(record, dict):
        return {k: _stable(v) for k, v in record.items() if k not in JSON_VOLATILE_KEYS}
    if isinstance(record, list):
        return [_stable(v) for v in record]
    return record


def _h5(a: Path, b: Path) -> list[str]:
    import h5py

    problems: list[str] = []

    def attrs(obj) -> dict:
        return {k: v for k, v in obj.attrs.items() if k not in H5_TIMING_ATTRS}

    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        names_x, names_y = [], []
        x.visit(names_x.append)
        y.visit(names_y.append)
        if sorted(names_x) != sorted(names_y):
            return [f"members differ: {sorted(set(names_x) ^ set(names_y))[:10]}"]
        for name in ["/", *names_x]:
            ox, oy = x[name], y[name]
            ax, ay = attrs(ox), attrs(oy)
            if sorted(ax) != sorted(ay) or any(not _arrays_equal(ax[k], ay[k]) for k in ax):
                problems.append(f"attributes of {name!r} differ")
            if isinstance(ox, h5py.Dataset) and not _arrays_equal(ox[()], oy[()]):
                problems.append(f"dataset {name!r} differs")
    return problems


def _pt(a: Path, b: Path) -> list[str]:
    if filecmp.cmp(a, b, shallow=False):
        return []
    import torch

    x = torch.load(a, map_location="cpu", weights_only=True)
    y = torch.load(b, map_location="cpu", weights_only=True)
    return _tensors(x, y, "")


def _tensors(x, y, where: str) -> list[str]:
    import torch

    if isinstance(x, dict) and isinstance(y, dict):
        if list(x) != list(y):
            return [f"keys of {where or 'the file'} differ"]
        kept = [k for k in x if k not in JSON_VOLATILE_KEYS]  # influence factors' stage timings
        return [p for k in kept for p in _tensors(x[k], y[k], f"{where}/{k}")]
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
        return [] if same else [f"tensor {where} differs"]
    nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
    return [] if x == y or nan else [f"value {where} differs"]


def _bits(t):
    """A tensor's bytes (NaN equal to NaN with the same bits)."""
    import torch

    flat = t.detach().reshape(-1)  # a 0-d tensor's may have stride 0, which view refuses
    return torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat).view(torch.uint8)


def _parquet(a: Path, b: Path) -> list[str]:
    if filecmp.cmp(a, b, shallow=False):
        return []
    import pyarrow.parquet as pq

    x, y = pq.read_table(a), pq.read_table(b)
    if not x.schema.equals(y.schema, check_metadata=True):
        return ["schemas (or their metadata) differ"]
    if x.num_rows != y.num_rows:
        return [f"{x.num_rows} rows != {y.num_rows}"]
    return [f"column {name!r} differs" for name in x.column_names if not _column_equal(x[name], y[name])]


def _column_equal(x, y) -> bool:
    """Two arrow columns of one type: nulls, list offsets and values the same (floats bit for bit)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    x, y = (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v for v in (x, y))
    if not pc.equal(pc.is_null(x), pc.is_null(y)).to_numpy(zero_copy_only=False).all():
        return False
    if pa.types.is_list(x.type) or pa.types.is_large_list(x.type):
        lengths = (pc.fill_null(pc.list_value_length(v), -1).to_numpy() for v in (x, y))
        return np.array_equal(*lengths) and _column_equal(pc.list_flatten(x), pc.list_flatten(y))
    if pa.types.is_floating(x.type) or pa.types.is_integer(x.type) or pa.types.is_boolean(x.type):
        return _arrays_equal(*(v.to_numpy(zero_copy_only=False) for v in (x, y)))
    return x.equals(y)


def compare_file(kind: str, a: Path, b: Path) -> list[str]:
    """What differs between two files of a kind ([] when equal)."""
    if kind == "parquet":
        return _parquet(a, b)
    if kind == "npz":
        return _npz(a, b)
    if kind == "h5":
        return _h5(a, b)
    if kind == "pt":
        return _pt(a, b)
    return [] if filecmp.cmp(a, b, shallow=False) else ["bytes differ"]


def compare_trees(base: Path, new: Path, produced_only: bool = False) -> tuple[Counter, list[str], Counter]:
    """(files compared per kind, problems, files left out per kind). With ``produced_only``, files
    of the base that the new tree does not hold (yet) are counted apart, not as problems."""
    files = {}
    for root in (base, new):
        for p in root.rglob("*"):
            if p.is_file():
                files.setdefault(p.relative_to(root), set()).add(root)
    compared, excluded, problems = Counter(), Counter(), []
    for rel in sorted(files):
        kind = _kind(rel)
        if kind == "excluded":
            excluded[rel.suffix or "(none)"] += 1
            continue
        if len(files[rel]) == 1:
            where = "base" if base in files[rel] else "new"
            if produced_only and where == "base":
                excluded[f".{kind} not produced in new"] += 1
            else:
                problems.append(f"{rel}: only in {where}")
            continue
        found = compare_file("bytes" if kind == "figure" else kind, base / rel, new / rel)
        if kind == "figure":
            excluded[f"{rel.suffix} (figure, bytes {'equal' if not found else 'differ'})"] += 1
            continue
        compared[kind] += 1
        problems += [f"{rel}: {p}" for p in found]
    return compared, problems, excluded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="the reference results/ folder")
    parser.add_argument("new", type=Path, help="the results/ folder to check against it")
    parser.add_argument("--show", type=int, default=30, help="differences to print (default 30)")
    parser.add_argument(
        "--produced-only",
        action="store_true",
        help="compare the files the new tree holds; count the base's others apart (a run not finished)",
    )
    args = parser.parse_args(argv)
    for folder in (args.base, args.new):
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder: give two results/ folders of the workflow")
    compared, problems, excluded = compare_trees(args.base, args.new, args.produced_only)
    kinds = ", ".join(f"{n} .{k}" for k, n in sorted(compared.items()))
    print(f"compared: {kinds} ({sum(compared.values())} files)")
    print("left out:", ", ".join(f"{n} {k}" for k, n in sorted(excluded.items())))
    if problems:
        print(f"{len(problems)} difference(s):")
        print("\n".join(f"  {p}" for p in problems[: args.show]))
        return 1
    print("identical: every compared table and array is the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
