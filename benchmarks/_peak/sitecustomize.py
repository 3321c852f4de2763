"""Each job's own peak memory, for the benchmarks: put this folder first on PYTHONPATH and set
EPOCHLENS_PEAKS to a folder; every Python process started under it (the jobs' scripts, which
Snakemake runs as ``.snakemake/scripts/tmpXXXX.<script>.py``) writes, as it exits, its script's
name and its peak resident memory (``ru_maxrss``, the kernel's high-water mark: what a cluster's
memory limit meets) to a file of its own there. Snakemake's benchmark files sample memory from
time to time and miss the top of a job of a few seconds. Nothing of epochlens imports this."""

import atexit
import os
import resource
import sys

_FOLDER = os.environ.get("EPOCHLENS_PEAKS")


def _write() -> None:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "-"
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    with open(os.path.join(_FOLDER, f"{os.getpid()}.tsv"), "a") as f:
        f.write(f"{script}\t{kb}\n")


if _FOLDER:
    atexit.register(_write)
