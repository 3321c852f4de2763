"""Faults and bad input, measured (issue 33): what a user reads when an input is wrong, and
what is left when a run is killed or its disk fills.

``--kill`` (:mod:`_faults_kill`) SIGKILLs a run of every rule kind K times and compares its
results with an uninterrupted run's; ``--disk`` (:mod:`_faults_disk`, as root) runs a job of each
rule kind on a filling file system. ``--inputs`` generates a corpus of bad inputs and runs each
where its error arises, then sorts the outcome into one of:

* ``clear``: an error message (epochlens' own, or Snakemake's for the workflow) that names the key
  or the file that is wrong, without a Python traceback before it;
* ``unnamed``: an error that does not name the key or file (a message to improve);
* ``traceback``: a Python traceback (an exception that is not epochlens' own) is what a user reads;
* ``silent``: nothing refused it: the job would run and write a result from it.

The corpus (:func:`corpus`):

* every key of ``config/schema.yaml`` (top level and a run's, nested) given a wrong type, an
  out-of-range value where the schema has a range (minimum, maximum, enum, pattern, minItems) and,
  per section, an unknown key beside it; the keys that name files or folders given a missing one.
  Checked as the workflow checks a config before planning (``epochlens.config.validate``, in
  process); a missing file that passes it is tried with ``snakemake --dry-run`` (where the
  workflow finds it);
* checkpoints (bare state_dicts, dicts under a key, safetensors): truncated, empty, text, NaN or
  Inf weights, missing or extra tensors, another architecture, another class count; loaded as a
  job loads them (``epochlens.job.load_checkpoint_job(...).model``);
* ``.npz`` data and ``cifar-100-python`` folders: truncated, NaN or Inf inputs or targets, wrong
  shapes, splits of mismatched lengths, labels out of range or of the wrong kind; read as
  ``scripts/prepare_data.py`` reads them;
* Hugging Face checkpoint folders without config.json or with a broken one, text data without
  its tokenizer; stored activations with a missing layer or rows.

Usage::

    .venv/bin/python benchmarks/faults.py --inputs [--json] [--no-dry-run]
    .venv/bin/python benchmarks/faults.py --kill [--kills K] [--seed S] [--keep DIR]
    .venv/bin/python benchmarks/faults.py --disk [--keep DIR] [--reference DIR]

``--inputs`` prints a table per family (inputs, clear, unnamed, traceback, silent) and the cases
that are not clear; ``--kill`` the kills, rules hit, outputs compared and differences; ``--disk``
a row per rule kind. docs/reliability.md gives the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules, when loaded by path

from _faults_config import base_config, config_cases, missing_file_cases  # noqa: E402
from _faults_files import checkpoint_cases, cifar_cases, npz_cases, tiny_dataset  # noqa: E402
from _faults_folders import hf_cases, stored_cases  # noqa: E402
from _faults_outcome import Case, Outcome, classify, table  # noqa: E402

__all__ = [
    "Case",
    "Outcome",
    "base_config",
    "checkpoint_cases",
    "cifar_cases",
    "classify",
    "config_cases",
    "corpus",
    "hf_cases",
    "missing_file_cases",
    "npz_cases",
    "stored_cases",
    "table",
    "tiny_dataset",
]


def corpus(root: Path, dry_run: bool = True) -> list[Case]:
    """Every bad input, its files made under ``root``."""
    dataset, order = tiny_dataset(root)
    return [
        *config_cases(root),
        *missing_file_cases(root, dry_run),
        *checkpoint_cases(root, dataset, order),
        *npz_cases(root),
        *cifar_cases(root),
        *hf_cases(root),
        *stored_cases(root),
    ]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", action="store_true", help="the bad-input corpus")
    p.add_argument("--no-dry-run", action="store_true", help="skip the dry runs of missing files")
    p.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    p.add_argument("--kill", action="store_true", help="SIGKILL a run of every rule kind K times")
    p.add_argument("--kills", type=int, default=50, help="--kill: kills made (default 50)")
    p.add_argument("--seed", type=int, default=0, help="--kill: seed of the kill moments")
    p.add_argument("--keep", type=Path, help="--kill, --disk: make the runs in this folder and keep them")
    p.add_argument("--disk", action="store_true", help="every rule kind on a filling tmpfs (as root)")
    p.add_argument("--rules", nargs="+", help="--disk: these rule kinds only")
    p.add_argument(
        "--reference",
        type=Path,
        help="--kill, --disk: reuse the reference run of this earlier --keep folder",
    )
    return p


def inputs(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its load report before the message of a mismatched folder
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        outcomes = [classify(case) for case in corpus(Path(tmp), not args.no_dry_run)]
    if args.json:
        records = [{"family": o.case.family, "input": o.case.name, "outcome": o.kind} for o in outcomes]
        print(json.dumps(records, indent=1))
        return 0
    print(table(outcomes))
    for o in outcomes:
        if o.kind != "clear":
            print(
                f"\n[{o.kind}] {o.case.family}: {o.case.name}\n  "
                + o.message.strip()[-800:].replace("\n", "\n  ")
            )
    return 0 if all(o.kind == "clear" for o in outcomes) else 1


def kill(args: argparse.Namespace) -> int:
    from _faults_kill import kill_run, kill_table
    from _faults_run import write_snapshots

    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="faults-kill-")))
        root.mkdir(parents=True, exist_ok=True)
        snapshots = args.reference / "snapshots" if args.reference else write_snapshots(root)
        report = kill_run(root, snapshots, args.kills, args.seed, args.reference)
    print(kill_table(report))
    for failure in report.failures:
        print("\n[failed run] " + failure.replace("\n", "\n  "))
    for difference in report.differences[:30]:
        print("  differs: " + difference)
    return 0 if not report.failures and not report.differences else 1


def disk(args: argparse.Namespace) -> int:
    from _faults_disk import disk_run, disk_table
    from _faults_kill import KillReport, reference_run
    from _faults_run import new_workdir, write_snapshots

    if os.geteuid() != 0:
        print("--disk mounts a tmpfs: run it as root", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="faults-disk-")))
        root.mkdir(parents=True, exist_ok=True)
        if args.reference:
            work, log = args.reference / "reference", (args.reference / "reference.log").read_text()
        else:
            user = new_workdir(root, "reference", write_snapshots(root))
            reference_run(user, root / "reference.log", KillReport())
            work, log = user.work, (root / "reference.log").read_text()
        outcomes = disk_run(work, log, root, args.rules)
    print(disk_table(outcomes))
    for o in outcomes:
        if o.detail:
            print(f"\n[{o.rule}]\n  " + o.detail.replace("\n", "\n  "))
    ok = all("file system is full" in o.error and not o.partial and o.rerun_equal for o in outcomes)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.inputs:
        return inputs(args)
    if args.kill:
        return kill(args)
    if args.disk:
        return disk(args)
    p.error("choose --inputs, --kill or --disk")


if __name__ == "__main__":
    sys.exit(main())
