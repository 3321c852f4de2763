"""The ``epochlens`` command. The pipeline itself runs with ``snakemake``; this holds the tools
around it."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from epochlens import __version__
from epochlens.scale_plan import add_parser as add_plan_parser  # torch-free

#: The workflow of this checkout (the library lives in its src/).
WORKFLOW = Path(__file__).resolve().parents[2]


def _doctor(args: argparse.Namespace) -> int:
    from epochlens.doctor import as_dict, run_doctor  # imports torch: only when asked

    plan = None
    if args.profile:
        plan = _device_plan(args)
        if not args.json:
            print(plan["table"] + "\n", flush=True)
    # On a cluster's login node, check what this machine has; the plan checks the config's device.
    device = args.device or (plan["device"] if plan and not plan["cluster"] else "auto")
    checks, verdict = run_doctor(device, plan["checks"] if plan else ())
    if args.json:
        report = as_dict(checks, verdict)
        if plan:
            report["rules"] = plan["rules"]
        print(json.dumps(report, indent=2))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for c in checks:
            print(f"[{marks[c.status]}] {c.name:<12} {c.detail}")
        print(f"\nverdict: {verdict}")
    return 1 if verdict.startswith("NOT READY") else 0


def _device_plan(args: argparse.Namespace) -> dict:
    """Which device each rule uses under ``args.profile`` (epochlens.rule_devices)."""
    from dataclasses import asdict

    from epochlens import rule_devices
    from epochlens.resource_plan import memory_plan, time_plan

    rules, config = rule_devices.workflow_rules(args.snakefile, args.configfile)
    profile = rule_devices.profile_settings(args.profile, args.snakefile)
    device = args.device or config.get("device", "auto")
    plan = rule_devices.plan_devices(rules, profile, device)
    table = rule_devices.format_plan(plan, profile, device)
    table += "\n\n" + memory_plan(rules, profile, config) + "\n\n" + time_plan(rules, profile, config)
    if profile.cluster:
        table += (
            "\nThe checks below are of this machine, not of the nodes: to check a GPU node, run "
            "epochlens doctor in a job there (e.g. srun --gpus=1 .venv/bin/epochlens doctor)."
        )
    return {
        "device": device,
        "cluster": profile.cluster,
        "table": table,
        "checks": rule_devices.plan_checks(plan, profile, device),
        "rules": [asdict(r) for r in plan],
    }


def _explore(args: argparse.Namespace) -> int:
    from epochlens.errors import EpochlensError
    from epochlens.explorer.serve import address, explorer_folder, make_server

    try:
        folder = explorer_folder(args.run, args.results)
    except EpochlensError as e:
        print(f"epochlens explore: {e}", file=sys.stderr)
        return 1
    server = make_server(folder, args.port)
    url = address(server)
    print(f"Serving the explorer of {folder} at {url}  (Ctrl-C stops it)", flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(url)
    with contextlib.suppress(KeyboardInterrupt), server:  # closed on the way out
        server.serve_forever()
    return 0


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
        "versions and a short curvature run, with a verdict; with --profile, first which device each "
        "rule's jobs use under that profile. Exit status 1 when not ready.",
    )
    doctor.add_argument(
        "--device",
        default=None,
        help="auto (CUDA, then MPS, then CPU), cpu, cuda:N, mps (default: the config's device, else auto)",
    )
    doctor.add_argument(
        "--profile",
        help="a Snakemake profile (folder or name): also say which rules get a GPU under it and which "
        "device each uses, and check the config's device against it",
    )
    doctor.add_argument(
        "--configfile",
        nargs="*",
        default=[],
        help="with --profile: your config file(s) (default: the workflow's embedded config)",
    )
    doctor.add_argument(
        "--snakefile", default=str(WORKFLOW / "Snakefile"), help="with --profile: the workflow's Snakefile"
    )
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=_doctor)
    add_plan_parser(sub, WORKFLOW / "Snakefile")
    _explore_parser(sub)
    return parser


def _explore_parser(sub) -> None:
    from epochlens.explorer.serve import DEFAULT_PORT

    explore = sub.add_parser(
        "explore",
        help="serve a run's sample explorer on 127.0.0.1 and print its address",
        description="Serve results/RUN/samples/explorer (a static page: the data map, filters, each "
        "sample's series, influence neighbours, the detectors' ROC) on 127.0.0.1 and print the address. "
        "Built first from results/RUN/samples/dossier.parquet when missing.",
    )
    explore.add_argument("run", help="a run's name (under --results), or a run's or an explorer's folder")
    explore.add_argument("--results", default="results", help="the results folder (default: ./results)")
    explore.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}, or a free one; 0: any)"
    )
    explore.add_argument("--open", action="store_true", help="also open it in the default web browser")
    explore.set_defaults(func=_explore)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
