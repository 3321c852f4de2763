"""Interpreting a run's configuration (plain dicts validated by config/schema.yaml)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import numpy as np
import yaml

from epochlens.errors import ConfigError, DataError
from epochlens.schedule import ClassSchedule

KNOWN_NUM_CLASSES = {"digits": 10, "cifar100": 100}


def explain_config_errors(config: dict, schema_path: str | Path) -> str:
    """One line per schema violation: where in the config, what is wrong, what is allowed."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    lines = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        hint = ""
        if err.validator == "additionalProperties" and isinstance(err.schema, dict):
            allowed = sorted(err.schema.get("properties", {}))
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        elif err.validator == "enum":
            hint = f"; allowed values: {', '.join(map(str, err.validator_value))}"
        lines.append(f"  - {where}: {err.message}{hint}")
    if not lines:
        return ""
    return (
        f"invalid configuration ({len(lines)} problem(s)); fix these keys in your config file "
        f"(documented in {schema_path}):\n" + "\n".join(lines)
    )


def num_classes(data_cfg: dict) -> int:
    """Number of classes of the configured data set, known before the data rule runs."""
    source = data_cfg["source"]
    if source in KNOWN_NUM_CLASSES:
        return KNOWN_NUM_CLASSES[source]
    path = Path(data_cfg["path"])
    if not path.is_file():
        raise DataError(f"{path}: data.path not found. Point data.path at an existing .npz file.")
    with np.load(path, allow_pickle=False) as archive:
        if "y_train" not in archive.files:
            raise DataError(f"{path}: no y_train array; see epochlens.data.dataset.load_npz for the layout.")
        return int(archive["y_train"].max()) + 1


def schedule(run_cfg: dict, class_order: np.ndarray | None = None) -> ClassSchedule:
    """The run's class schedule; without ``class_order`` the identity order (for epoch lists)."""
    if class_order is None:
        class_order = np.arange(num_classes(run_cfg["data"]))
    s = run_cfg["schedule"]
    return ClassSchedule(class_order, s["initial_classes"], s["increment"], s["epochs_per_task"])


def checkpoint_epochs(run_cfg: dict) -> list[int]:
    """Epochs that have a checkpoint (when the pipeline trains) or are expected to (a folder)."""
    ckpt = run_cfg.get("checkpoints", {})
    save_every = ckpt.get("save_every") if ckpt.get("source", "train") == "train" else None
    return schedule(run_cfg).checkpoint_epochs(save_every)


def analysis_epochs(run_name: str, run_cfg: dict) -> list[int]:
    """Checkpoint epochs to analyse: ``epochs`` from the config, or every checkpoint."""
    available = checkpoint_epochs(run_cfg)
    chosen = run_cfg.get("epochs")
    if not chosen:
        return available
    trained = run_cfg.get("checkpoints", {}).get("source", "train") == "train"
    unknown = sorted(set(chosen) - set(available))
    if trained and unknown:
        raise ConfigError(
            f"runs.{run_name}.epochs: {unknown} are not checkpoint epochs of this schedule "
            f"(training writes {available}); pick from those or set checkpoints.save_every."
        )
    last = available[-1]
    if unknown and max(unknown) > last:
        raise ConfigError(f"runs.{run_name}.epochs: {max(unknown)} is past the end of the schedule ({last}).")
    return sorted(chosen)


def curvature_epochs(run_name: str, run_cfg: dict) -> list[int]:
    """Epochs whose curvature is computed: ``curvature.epochs``, or every analysed epoch."""
    return section_epochs(run_name, run_cfg, "curvature")


def section_epochs(run_name: str, run_cfg: dict, section: str) -> list[int]:
    """Epochs of a per-checkpoint analysis ``section`` (e.g. ``features``, ``ablation``): its
    ``epochs``, or every analysed epoch; none when the section is disabled."""
    analysed = analysis_epochs(run_name, run_cfg)
    spec = run_cfg.get(section) or {}
    if not spec.get("enabled", True):
        return []
    chosen = spec.get("epochs")
    if not chosen:
        return analysed
    unknown = sorted(set(chosen) - set(analysed))
    if unknown:
        raise ConfigError(
            f"runs.{run_name}.{section}.epochs: {unknown} are not analysed epochs of this run "
            f"({analysed}); pick from those or change runs.{run_name}.epochs."
        )
    return sorted(chosen)
