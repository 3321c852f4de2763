"""Faults and bad input, measured (issue 33): what a user reads when an input is wrong.

``--inputs`` generates a corpus of bad inputs and runs each where its error arises, then sorts
the outcome into one of:

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

Prints a table per family (inputs, clear, unnamed, traceback, silent) and the cases that are not
clear. docs/reliability.md gives the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import re
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from epochlens import config as run_config  # noqa: E402
from epochlens.errors import EpochlensError  # noqa: E402

SCHEMA = REPO / "config" / "schema.yaml"
RUN = "tiny"
OUTCOMES = ("clear", "unnamed", "traceback", "silent")
MISSING = "/nonexistent/faults"


@dataclass
class Case:
    """One bad input: ``family`` (its table), ``name``, what the message must name (any of
    ``names``), and ``check``: a function that raises as the pipeline would, or returns normally
    when nothing refuses the input (a dry run's output when it is one)."""

    family: str
    name: str
    names: tuple[str, ...]
    check: Callable[[], str | None]
    dry_run: Callable[[], subprocess.CompletedProcess] | None = None


@dataclass
class Outcome:
    case: Case
    kind: str
    message: str = field(repr=False, default="")


# ---------------------------------------------------------------------------------------------
# Classifying


PY_ERRORS = (
    ("KeyError", "TypeError", "AttributeError", "IndexError", "ValueError", "ZeroDivisionError")
    + ("RuntimeError", "AssertionError", "NameError", "OSError", "FileNotFoundError")
    + ("UnpicklingError", "EOFError")
)


def classify(case: Case) -> Outcome:
    """Run ``case`` and sort its outcome (module doc)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # transformers' load reports
            case.check()
    except EpochlensError as exc:
        message = str(exc)
    except Exception:  # what a user reads when a job meets it: a traceback
        return Outcome(case, "traceback", traceback.format_exc(limit=4))
    else:
        if case.dry_run is None:
            return Outcome(case, "silent")
        return classify_dry_run(case, case.dry_run())
    return Outcome(case, "clear" if names_any(message, case.names) else "unnamed", message)


def classify_dry_run(case: Case, proc: subprocess.CompletedProcess) -> Outcome:
    """A dry run's outcome. An error raised while planning is framed by Snakemake (an
    InputFunctionException naming the rule, ``Error:``, the message, and the rule file's lines):
    the message is what counts, a traceback when it is a bare Python exception. A dry run that
    succeeds is silent unless it warned, naming the file (a missing checkpoint under --keep-going:
    its job then fails with the fix)."""
    out = proc.stdout + proc.stderr
    error = re.search(r"Error:\n\s+(\w+):", out)
    if "Traceback (most recent call last)" in out or (error and error.group(1) in PY_ERRORS):
        return Outcome(case, "traceback", out[-3000:])
    if proc.returncode == 0 and not names_any(out, case.names):
        return Outcome(case, "silent", out[-1500:])
    return Outcome(case, "clear" if names_any(out, case.names) else "unnamed", out[-3000:])


def names_any(message: str, names: tuple[str, ...]) -> bool:
    return any(n in message for n in names)


# ---------------------------------------------------------------------------------------------
# Config keys


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


def tiny_dataset(root: Path) -> tuple[Path, Path]:
    """The tiny run's dataset.h5 and class_order.npy, made as its jobs make them."""
    from epochlens.atomic import save_npy
    from epochlens.data import holdout_mask, load_source, write_dataset
    from epochlens.schedule import make_class_order

    dataset = load_source("digits")
    dataset.holdout = holdout_mask(dataset.train_labels, 5)
    write_dataset(dataset, root / "dataset.h5")
    save_npy(root / "class_order.npy", make_class_order(dataset.num_classes, 0))
    return root / "dataset.h5", root / "class_order.npy"


SCHEDULE = {"initial_classes": 4, "increment": 3, "epochs_per_task": 2}


def evaluated(dataset: Path, order: Path, checkpoint: Path, model="small_cnn") -> Callable[[], None]:
    """What evaluate_checkpoint does with a checkpoint: load it into the model and evaluate it."""

    def check() -> None:
        from epochlens.evaluation import evaluate_checkpoint
        from epochlens.job import load_checkpoint_job

        job = load_checkpoint_job(dataset, checkpoint, model, 2, "cpu", order, SCHEDULE)
        evaluate_checkpoint(job.model, job.data, job.schedule, job.epoch, 256, job.device)

    return check


def checkpoint_cases(root: Path, dataset: Path, order: Path) -> list[Case]:
    import torch
    from safetensors.torch import save_file

    from epochlens.models.networks import SmallCNN, build_model

    torch.manual_seed(0)
    good = SmallCNN(num_classes=10).state_dict()
    first = next(iter(good))
    variants: dict[str, object] = {
        "NaN weights": {k: v.clone().fill_(float("nan")) if k == first else v for k, v in good.items()},
        "Inf weights": {k: v.clone().fill_(float("inf")) if k == first else v for k, v in good.items()},
        "a tensor missing": {k: v for k, v in good.items() if k != first},
        "an extra tensor": {**good, "extra.weight": torch.zeros(3)},
        "another architecture (resnet18_lop)": build_model("resnet18_lop", 10, 1).state_dict(),
        "another class count (5)": SmallCNN(num_classes=5).state_dict(),
        "float16 weights with NaN": {
            k: v.half().fill_(float("nan")) if k == first else v.half() for k, v in good.items()
        },
    }
    cases = []
    for fmt in ("pt", "safetensors"):
        folder = root / f"checkpoints-{fmt}"
        folder.mkdir()
        files = {}
        for name, state in variants.items():
            path = folder / f"{len(files)}.{fmt}"
            if fmt == "pt":
                torch.save(state, path)
            else:
                save_file({k: v.contiguous() for k, v in state.items()}, str(path))
            files[name] = path
        whole = folder / f"whole.{fmt}"
        (torch.save(good, whole) if fmt == "pt" else save_file(good, str(whole)))
        data = whole.read_bytes()
        for name, content in {
            "truncated to half": data[: len(data) // 2],
            "truncated to 10 bytes": data[:10],
            "empty": b"",
            "text, not a checkpoint": b"this is not a checkpoint\n",
        }.items():
            path = folder / f"{len(files)}.{fmt}"
            path.write_bytes(content)
            files[name] = path
        if fmt == "pt":
            for name, obj in {
                "a list, not a state_dict": [1, 2, 3],
                "a dict without tensors": {"epoch": 3, "lr": 0.1},
                "a state_dict under an unknown key": {"weights_v2": {"w": good}},
            }.items():
                path = folder / f"{len(files)}.pt"
                torch.save(obj, path)
                files[name] = path
        (folder / "a folder.pt").mkdir()
        files["a folder, not a file"] = folder / "a folder.pt"
        for name, path in files.items():
            cases.append(Case(f"checkpoint (.{fmt})", name, (str(path),), evaluated(dataset, order, path)))
    return cases


def prepared(source: str, path: Path, task: str = "classification", **options) -> Callable[[], None]:
    """What prepare_data does with a data set: read it, check it fits the task, split the holdout."""

    def check() -> None:
        from epochlens.data import holdout_mask, load_source
        from epochlens.data.dataset import check_kind

        dataset = load_source(source, str(path), **options)
        check_kind(dataset, task)
        holdout_mask(dataset.train_labels, 0)

    return check


def npz_arrays(rng: np.random.Generator, regression: bool = False) -> dict[str, np.ndarray]:
    x_train, x_test = rng.standard_normal((60, 1, 4, 4)), rng.standard_normal((20, 1, 4, 4))
    if regression:
        return {
            "x_train": x_train,
            "y_train": rng.standard_normal((60, 2)),
            "x_test": x_test,
            "y_test": rng.standard_normal((20, 2)),
        }
    return {"x_train": x_train, "y_train": np.arange(60) % 3, "x_test": x_test, "y_test": np.arange(20) % 3}


def npz_cases(root: Path) -> list[Case]:
    rng = np.random.default_rng(0)
    folder = root / "npz"
    folder.mkdir()

    def edit(**changes):
        def make(regression=False):
            arrays = npz_arrays(rng, regression)
            for key, fn in changes.items():
                if fn is None:
                    del arrays[key]
                else:
                    arrays[key] = fn(arrays[key])
            return arrays

        return make

    def nan_at(a):
        a = a.astype(np.float64)
        a.flat[3] = np.nan
        return a

    def inf_at(a):
        a = a.astype(np.float64)
        a.flat[0] = np.inf
        return a

    variants = {
        "NaN in x_train": (edit(x_train=nan_at), "classification"),
        "Inf in x_test": (edit(x_test=inf_at), "classification"),
        "NaN in regression y_train": (
            lambda: {**npz_arrays(rng, True), "y_train": nan_at(rng.standard_normal((60, 2)))},
            "regression",
        ),
        "Inf in regression y_test": (
            lambda: {**npz_arrays(rng, True), "y_test": inf_at(rng.standard_normal((20, 2)))},
            "regression",
        ),
        "x_test of another shape": (edit(x_test=lambda a: a[:, :, :3]), "classification"),
        "x_train 1-D": (edit(x_train=lambda a: a.reshape(-1)[:60]), "classification"),
        "y_train shorter than x_train": (edit(y_train=lambda a: a[:50]), "classification"),
        "x_test longer than y_test": (edit(x_test=lambda a: np.concatenate([a, a])), "classification"),
        "negative class id": (edit(y_train=lambda a: a - 1), "classification"),
        "class ids as floats (classification)": (
            edit(y_train=lambda a: a.astype(np.float32), y_test=lambda a: a.astype(np.float32)),
            "classification",
        ),
        "integer targets (regression)": (edit(), "regression"),
        "y_train 2-D class ids": (edit(y_train=lambda a: a.reshape(-1, 1)), "classification"),
        "x_train missing": (edit(x_train=None), "classification"),
        "empty training split": (edit(x_train=lambda a: a[:0], y_train=lambda a: a[:0]), "classification"),
        "string labels": (
            edit(y_train=lambda a: a.astype(str), y_test=lambda a: a.astype(str)),
            "classification",
        ),
        "object array": (edit(x_train=lambda a: a.astype(object)), "classification"),
    }
    cases = []
    for k, (name, (make, task)) in enumerate(variants.items()):
        path = folder / f"{k}.npz"
        np.savez(path, **make())
        cases.append(Case("data (.npz)", name, (str(path),), prepared("npz", path, task)))
    whole = folder / "whole.npz"
    np.savez(whole, **npz_arrays(rng))
    for name, content in {"truncated": whole.read_bytes()[:300], "empty": b"", "text": b"x,y\n1,2\n"}.items():
        path = folder / f"{name}.npz"
        path.write_bytes(content)
        cases.append(Case("data (.npz)", f"file {name}", (str(path),), prepared("npz", path)))
    return cases


def cifar_cases(root: Path) -> list[Case]:
    import pickle

    def write(
        folder: Path,
        labels_offset: int = 0,
        drop: str | None = None,
        rows: int = 3072,
        truncate: str | None = None,
    ):
        folder.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for split, n in (("train", 200), ("test", 100)):
            labels = (np.arange(n) % 100 + labels_offset).tolist()
            d = {
                "filenames": [f"{i}.png" for i in range(n)],
                "fine_labels": labels,
                "coarse_labels": [0] * n,
                "data": rng.integers(0, 256, (n, rows), dtype=np.uint8),
            }
            if drop:
                d.pop(drop)
            (folder / split).write_bytes(pickle.dumps(d, protocol=2))
        (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [str(c) for c in range(100)]}))
        if truncate:
            data = (folder / truncate).read_bytes()
            (folder / truncate).write_bytes(data[: len(data) // 2])
        return folder

    base = root / "cifar"
    variants = {
        "train truncated": dict(truncate="train"),
        "labels out of range (100..199)": dict(labels_offset=100),
        "negative labels": dict(labels_offset=-1),
        "no fine_labels": dict(drop="fine_labels"),
        "no data": dict(drop="data"),
        "rows of 1000 bytes (not 32x32x3)": dict(rows=1000),
    }
    cases = []
    for k, (name, kwargs) in enumerate(variants.items()):
        folder = write(base / str(k), **kwargs)
        cases.append(Case("data (cifar-100-python)", name, (str(folder),), prepared("cifar100", folder)))
    folder = write(base / "nometa")
    (folder / "meta").unlink()
    (folder / "test").unlink()
    cases.append(
        Case("data (cifar-100-python)", "no test file", (str(folder),), prepared("cifar100", folder))
    )
    return cases


def hf_loaded(folder: Path) -> Callable[[], None]:
    """What a job does with a Hugging Face checkpoint folder (epochlens.job: _build_hf_model)."""

    def check() -> None:
        from epochlens.models.hf import load_hf_model

        load_hf_model(folder, num_labels=2, pad_token_id=0, vocab_size=100)

    return check


def tokenizer_loaded(folder: Path) -> Callable[[], None]:
    def check() -> None:
        from epochlens.formats.text import load_tokenizer

        load_tokenizer(folder)

    return check


def hf_cases(root: Path) -> list[Case]:
    """Checkpoint folders of a tiny BERT (save_pretrained), each broken one way; tokenizer folders."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig

    from epochlens.models.hf import write_tiny_model

    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, vocab_size=100, num_labels=2, pad_token_id=0,
    )  # fmt: skip
    good = write_tiny_model(root / "hf" / "good", config)
    weights = good / "model.safetensors"

    def broken(name: str, fix: Callable[[Path], None]) -> Case:
        folder = root / "hf" / name.replace(" ", "_")
        shutil.copytree(good, folder)
        fix(folder)
        return Case("Hugging Face folder", name, (str(folder),), hf_loaded(folder))

    def nan(folder: Path) -> None:
        state = load_file(str(folder / "model.safetensors"))
        first = next(k for k, v in state.items() if v.is_floating_point())
        state[first] = torch.full_like(state[first], float("nan"))
        save_file(state, str(folder / "model.safetensors"))

    other = BertConfig(
        hidden_size=48, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    cases = [
        broken("no config.json", lambda f: (f / "config.json").unlink()),
        broken("config.json not JSON", lambda f: (f / "config.json").write_text("{model_type: bert")),
        broken(
            "config.json of an unknown model_type",
            lambda f: (f / "config.json").write_text('{"model_type": "nonesuch"}'),
        ),
        broken("config.json of another size", lambda f: other.save_pretrained(f)),
        broken("no weights", lambda f: (f / "model.safetensors").unlink()),
        broken(
            "weights truncated", lambda f: (f / "model.safetensors").write_bytes(weights.read_bytes()[:2000])
        ),
        broken("weights empty", lambda f: (f / "model.safetensors").write_bytes(b"")),
        broken("NaN weights", nan),
    ]
    empty = root / "hf" / "tokenizer-empty"
    empty.mkdir()
    bad = root / "hf" / "tokenizer-broken"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    cases += [
        Case("tokenizer folder", "no tokenizer files", (str(empty),), tokenizer_loaded(empty)),
        Case("tokenizer folder", "tokenizer.json broken", (str(bad),), tokenizer_loaded(bad)),
        Case(
            "tokenizer folder",
            "missing folder",
            (f"{MISSING}/tok",),
            tokenizer_loaded(Path(f"{MISSING}/tok")),
        ),
    ]
    return cases


def stored_built(folder: Path, data) -> Callable[[], None]:
    """What the features job of a stored-activations run does with a snapshot folder."""

    def check() -> None:
        from epochlens.features.stored import load_or_build
        from epochlens.features.stored_settings import StoredFeatureSettings

        load_or_build(folder.parent / f"{folder.name}.h5", folder, data, StoredFeatureSettings())

    return check


def stored_cases(root: Path) -> list[Case]:
    """Snapshots of stored activations (``npy`` layout: ``{split}/{layer}.npy``) of a 60 + 20
    sample data set, each broken one way."""
    from epochlens.data import load_source

    rng = np.random.default_rng(0)
    np.savez(root / "stored-data.npz", **npz_arrays(rng))
    data = load_source("npz", str(root / "stored-data.npz"))
    sizes = {"train": 60, "test": 20}

    def snapshot(name: str, fix: Callable[[Path], None]) -> Case:
        folder = root / "stored" / name.replace(" ", "_")
        for split, n in sizes.items():
            (folder / split).mkdir(parents=True)
            for layer in ("block1", "block2"):
                np.save(folder / split / f"{layer}.npy", rng.standard_normal((n, 8)).astype(np.float32))
        fix(folder)
        return Case("stored activations", name, (str(folder),), stored_built(folder, data))

    def nan(folder: Path) -> None:
        a = np.load(folder / "train" / "block1.npy")
        a[5, 2] = np.nan
        np.save(folder / "train" / "block1.npy", a)

    npy = "train/block1.npy"
    return [
        snapshot("a layer missing in test", lambda f: (f / "test" / "block2.npy").unlink()),
        snapshot("rows missing (50 of 60)", lambda f: np.save(f / npy, np.zeros((50, 8), np.float32))),
        snapshot("rows extra (70 of 60)", lambda f: np.save(f / npy, np.zeros((70, 8), np.float32))),
        snapshot(
            "no test split", lambda f: [p.unlink() for p in (f / "test").iterdir()] and (f / "test").rmdir()
        ),
        snapshot("a layer truncated", lambda f: (f / npy).write_bytes((f / npy).read_bytes()[:200])),
        snapshot("a layer empty", lambda f: (f / npy).write_bytes(b"")),
        snapshot("one number per row", lambda f: np.save(f / npy, np.zeros(60, np.float32))),
        snapshot("NaN activations", nan),
        snapshot(
            "test layer of another width",
            lambda f: np.save(f / "test" / "block1.npy", np.zeros((20, 5), np.float32)),
        ),
        snapshot("no layers", lambda f: [p.unlink() for s in sizes for p in (f / s).iterdir()]),
    ]


# ---------------------------------------------------------------------------------------------
# The report


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


def table(outcomes: list[Outcome]) -> str:
    families = list(dict.fromkeys(o.case.family for o in outcomes))
    counts = Counter((o.case.family, o.kind) for o in outcomes)
    rows = [("inputs", "family", *OUTCOMES)]
    for family in [*families, "total"]:
        picked = [o for o in outcomes if family in ("total", o.case.family)]
        rows.append((str(len(picked)), family, *(str(sum(o.kind == k for o in picked)) for k in OUTCOMES)))
    del counts
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:-1], "-" * len(lines[0]), lines[-1]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", action="store_true", help="the bad-input corpus")
    p.add_argument("--no-dry-run", action="store_true", help="skip the dry runs of missing files")
    p.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    args = p.parse_args(argv)
    if not args.inputs:
        p.error("choose --inputs")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its load report before the message of a mismatched folder
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        outcomes = [classify(case) for case in corpus(Path(tmp), not args.no_dry_run)]
    if args.json:
        print(
            json.dumps(
                [{"family": o.case.family, "input": o.case.name, "outcome": o.kind} for o in outcomes],
                indent=1,
            )
        )
        return 0
    print(table(outcomes))
    for o in outcomes:
        if o.kind != "clear":
            print(
                f"\n[{o.kind}] {o.case.family}: {o.case.name}\n  "
                + o.message.strip()[-800:].replace("\n", "\n  ")
            )
    return 0 if all(o.kind == "clear" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
