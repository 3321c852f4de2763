"""Bad inputs of the config: every schema key given a wrong type, an out-of-range value, an unknown
sibling key, and the keys that name files given a missing one (``benchmarks/faults.py --inputs``)."""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from _faults_outcome import MISSING, REPO, RUN, Case  # noqa: E402  (puts src on the path)

from epochlens import config as run_config  # noqa: E402

SCHEMA = REPO / "config" / "schema.yaml"


def base_config(root: Path) -> dict:
    """The tiny run of the workflow tests (digits, random SmallCNN checkpoints in ``root``),
    every stage on."""
    return {
        "device": "cpu",
        "runs": {
            RUN: {
                "data": {"source": "digits", "holdout_per_class": 5},
                "model": {"name": "small_cnn"},
                "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
                "indices": [0],
                "checkpoints": {"source": "folder", "path": str(root / "index-{index}_epoch-{epoch}.pt")},
                "influence": {"enabled": True, "methods": ["identity"]},
            }
        },
    }


def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def _resolve(node, defs: dict):
    while isinstance(node, dict) and "$ref" in node:
        node = defs[node["$ref"].split("/")[-1]]
    return node


def schema_leaves(node, defs: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    """(path, schema) of every key below ``node`` reached through ``properties``; sections too
    (marked by their ``properties``)."""
    node = _resolve(node, defs)
    if not isinstance(node, dict):
        return
    if path:
        yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from schema_leaves(sub, defs, (*path, key))


def _types(node: dict) -> set[str]:
    t = node.get("type")
    if t is None and "enum" in node:
        return {type_name(v) for v in node["enum"]}
    return set(t) if isinstance(t, list) else {t} if t else set()


def type_name(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


WRONG = ["3", 3, 2.5, True, ["a"], {"a": 1}]


def wrong_type(node: dict):
    """A value of a type the key does not take (quoted numbers first: the commonest slip)."""
    allowed = _types(node)
    if not allowed:
        return None
    if "number" in allowed:
        allowed.add("integer")
    for value in WRONG:
        if type_name(value) not in allowed:
            return value
    return None


def out_of_range(node: dict) -> list[tuple[str, object]]:
    """Values beyond each bound the key declares."""
    found = []
    integer = "integer" in _types(node) and "number" not in _types(node)
    step = 1 if integer else 0.5
    for bound, sign in (("minimum", -1), ("maximum", 1)):
        if bound in node:
            found.append((bound, node[bound] + sign * step))
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node:
            found.append((bound, node[bound]))
    if "enum" in node:
        sample = node["enum"][0]
        found.append(("enum", "not_a_choice" if isinstance(sample, str) else 987654))
    if node.get("minItems", 0) >= 1:
        found.append(("minItems", []))
    if "pattern" in node:
        found.append(("pattern", "!! not matching !!"))
    return found


def set_key(cfg: dict, path: tuple[str, ...], value) -> None:
    node = cfg
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def validated(cfg: dict) -> Callable[[], None]:
    def check() -> None:
        run_config.validate(copy.deepcopy(cfg), SCHEMA)

    return check


def config_cases(root: Path) -> list[Case]:
    """Wrong types, out-of-range values and unknown keys of every key of the schema."""
    schema = _schema()
    defs = schema.get("$defs", {})
    base = base_config(root)
    cases = []
    top = {k: v for k, v in schema["properties"].items() if k != "runs"}
    run = _resolve(schema["properties"]["runs"]["additionalProperties"], defs)
    keys = [(p, n) for p, n in schema_leaves({"properties": top}, defs)]
    keys += [(("runs", RUN, *p), n) for p, n in schema_leaves(run, defs)]
    for path, node in keys:
        dotted = ".".join(path)
        if "properties" in node and node.get("additionalProperties") is False:
            cfg = copy.deepcopy(base)
            parent = cfg
            for key in path:
                parent = parent.setdefault(key, {}) if isinstance(parent.get(key, {}), dict) else None
                if parent is None:
                    break
            if parent is not None:
                parent["not_a_key"] = 1
                cases.append(
                    Case("config: unknown key", f"{dotted}.not_a_key", ("not_a_key",), validated(cfg))
                )
        value = wrong_type(node)
        if value is not None:
            cfg = copy.deepcopy(base)
            set_key(cfg, path, value)
            cases.append(Case("config: wrong type", f"{dotted} = {value!r}", (dotted,), validated(cfg)))
        for bound, value in out_of_range(node):
            cfg = copy.deepcopy(base)
            set_key(cfg, path, value)
            cases.append(
                Case("config: out of range", f"{dotted} = {value!r} ({bound})", (dotted,), validated(cfg))
            )
    return cases


def missing_file_cases(root: Path, dry_run: bool) -> list[Case]:
    """Each key that names a file or folder, given one that does not exist, in a run where it is
    read. Checked as a config; what passes is tried with ``snakemake --dry-run``."""
    command = {
        "source": "command",
        "command": f"python {root / 'train.py'} --out {{output}}",
        "path": "ckpt_{epoch}.pt",
    }
    npz = {"source": "npz", "path": str(root / "data.npz")}
    (root / "train.py").write_text("print('a training script')\n")
    factory = {"factory": "pkg.model:build", "project_path": str(root / "project")}
    variants = {
        "data.path (npz)": {"data": {"source": "npz", "path": f"{MISSING}/data.npz"}},
        "data.path (cifar100)": {"data": {"source": "cifar100", "path": f"{MISSING}/cifar-100-python"}},
        "data.path (imagefolder)": {"data": {"source": "imagefolder", "path": f"{MISSING}/images"}},
        "data.ground_truth.indices": {
            "data": {**npz, "ground_truth": {"indices": f"{MISSING}/poisoned.npy"}}
        },
        "model.project_path": {"model": {**factory, "project_path": f"{MISSING}/project"}},
        "class_order.path": {"class_order": {"source": "file", "path": f"{MISSING}/index-{{index}}.npy"}},
        "checkpoints.path": {"checkpoints": {"source": "folder", "path": f"{MISSING}/e{{epoch}}.pt"}},
        "checkpoints.repository": {"checkpoints": {**command, "repository": f"{MISSING}/code"}},
        "checkpoints.files": {"checkpoints": {**command, "files": [f"{MISSING}/cfg.json"]}},
        "checkpoints.command (script)": {
            "checkpoints": {**command, "command": f"python {MISSING}/train.py {{output}}"}
        },
    }
    cases = []
    for key, sections in variants.items():
        cfg = base_config(root)
        cfg["runs"][RUN].update(sections)
        if sections.get("checkpoints", {}).get("source") == "command":
            cfg["runs"][RUN].update(schedule="none", epochs=[0], data=npz)
        names = (key.split(" ")[0], MISSING)
        cases.append(
            Case(
                "config: missing file",
                key,
                names,
                validated(cfg),
                dry_runner(root, key, cfg) if dry_run else None,
            )
        )
    return cases


def dry_runner(root: Path, key: str, cfg: dict) -> Callable[[], subprocess.CompletedProcess]:
    def run() -> subprocess.CompletedProcess:
        work = Path(tempfile.mkdtemp(prefix="dry-", dir=root))
        (work / "config.yaml").write_text(yaml.safe_dump(cfg))
        command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory"]
        command += [str(work), "--cores", "1", "--dry-run", "--configfile", str(work / "config.yaml")]
        return subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)

    return run


# ---------------------------------------------------------------------------------------------
# Files: checkpoints, data, Hugging Face folders, stored activations
