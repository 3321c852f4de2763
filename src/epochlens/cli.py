"""The ``epochlens`` command. The pipeline itself runs with ``snakemake``; this holds the tools
around it."""

from __future__ import annotations

import argparse
import json
import sys

from epochlens import __version__


def _doctor(args: argparse.Namespace) -> int:
    from epochlens.doctor import as_dict, run_doctor  # imports torch: only when asked

    checks, verdict = run_doctor(args.device)
    if args.json:
        print(json.dumps(as_dict(checks, verdict), indent=2))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for c in checks:
            print(f"[{marks[c.status]}] {c.name:<12} {c.detail}")
        print(f"\nverdict: {verdict}")
    return 1 if verdict.startswith("NOT READY") else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epochlens",
        description="Tools around the epochlens workflow (the pipeline itself runs with snakemake).",
    )
    parser.add_argument("--version", action="version", version=f"epochlens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor",
        help="check this machine: packages, device, dtypes, a short curvature run",
        description="Smoke test of the device (CUDA, MPS or CPU), dtype support, memory, installed "
        "versions and a short curvature run, with a verdict. Exit status 1 when not ready.",
    )
    doctor.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda:N, mps")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
