"""Two runs of the same config give identical result files.

Everything under results/ is compared by a digest of its content, except logs and benchmark
timings. Fields that only record how long something took (compute_time_seconds, ...) or when are
removed from JSON, npz headers and HDF5 attributes first; every number computed from the data must
match bit for bit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from wfutil import copy_workflow, snakemake, write_config

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

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


def test_two_runs_give_identical_results(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0],
        "checkpoints": {"source": "train"},  # task boundaries: epochs 0, 2, 4, 6
        # Every stage, at fewer epochs than a run analyses by default (24 jobs a run, not 37): the
        # test's claim is bit-equal files, which does not need more of them. Probes cheap (as
        # wfutil's tiny run).
        "curvature": {"epochs": [4, 6]},
        "features": {"epochs": [6]},
        "probes": {"seeds": [0], "max_epochs": 20},
        "ablation": {"epochs": [6]},
    }
    cfg = write_config(tmp_path / "repro.yaml", {"device": "cpu", "runs": {"repro": run}})
    digests = []
    for name in ("first", "second"):
        work = tmp_path / name
        work.mkdir()
        snakemake(wf, work, configfile=cfg)
        digests.append(result_digests(work))
    first, second = digests
    assert set(first) == set(second)
    kinds = {Path(p).suffix for p in first}
    assert {".pt", ".npy", ".csv", ".json", ".png", ".pdf", ".h5"} <= kinds, kinds
    differ = sorted(p for p in first if first[p] != second[p])
    assert not differ, f"{len(differ)} of {len(first)} result files differ: {differ[:10]}"
