"""Digests of a results/ tree for "two runs give identical results" (tests/workflow/test_rerun_graph.py).

Everything under results/ is digested by its content, except logs and benchmark timings. Fields that
only record how long something took (compute_time_seconds, ...) or when are removed from JSON, npz
headers and HDF5 attributes first; every number computed from the data must match bit for bit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np

#: Keys that hold timings or timestamps, wherever they occur.
VOLATILE = {"compute_time_seconds", "compute_seconds", "seconds", "created_utc", "timings", "elapsed_seconds"}


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _json_digest(text: str) -> str:
    return json.dumps(_strip(json.loads(text)), sort_keys=True)


def digest(path: Path) -> str:
    """sha256 of a result file's content, timings left out (see module doc)."""
    h = hashlib.sha256()
    if path.suffix == ".json":
        h.update(_json_digest(path.read_text()).encode())
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            for key in sorted(z.files):
                value = z[key]
                h.update(key.encode())
                if key == "header":
                    h.update(_json_digest(str(value)).encode())
                else:
                    h.update(str(value.dtype).encode() + value.tobytes())
    elif path.suffix == ".h5":
        with h5py.File(path, "r") as f:

            def visit(name, obj):
                h.update(name.encode())
                for key in sorted(obj.attrs):
                    if key not in VOLATILE:
                        h.update(key.encode() + repr(obj.attrs[key]).encode())
                if isinstance(obj, h5py.Dataset):
                    h.update(obj[()].tobytes())

            visit("/", f)
            f.visititems(visit)
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def result_digests(work: Path) -> dict[str, str]:
    results = work / "results"
    return {
        str(p.relative_to(results)): digest(p)
        for p in sorted(results.rglob("*"))
        if p.is_file() and not {"logs", "benchmarks"} & set(p.relative_to(results).parts)
    }
