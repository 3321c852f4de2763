"""Checks of a run of stored activations (``checkpoints.source: activations``), torch-free: no
model, features and probes only, and ``features.layers`` against the first snapshot's columns, all
while the workflow plans (the probes section is checked with every run's, in :mod:`.checks`)."""

from __future__ import annotations

from pathlib import Path

from epochlens.config import epochs
from epochlens.config.defaults import MODEL_STAGES
from epochlens.errors import ConfigError, FeatureError


def check_stored_config(name: str, run: dict) -> None:
    """A run of stored activations: features and probes only, no model; its snapshots exist."""
    key = f"runs.{name}"
    on = [s for s in MODEL_STAGES if run[s]["enabled"]]
    if on:
        raise ConfigError(
            f"{key}: checkpoints.source: activations has no model, so {on} cannot run; remove "
            + ", ".join(f"{key}.{s}.enabled: true" for s in on)
            + " (off by default for stored activations: features and probes read them)."
        )
    if run.get("model"):
        raise ConfigError(f"{key}.model: a run of stored activations has no model; remove the model section.")
    if "probes" in run and run["probes"]["enabled"] and not run["features"]["enabled"]:
        raise ConfigError(
            f"{key}.probes.enabled: probes need the features; set {key}.features.enabled: true."
        )
    from epochlens.features.stored_settings import StoredFeatureSettings

    spec = run["features"]
    StoredFeatureSettings(
        layers=spec["layers"],
        representations=spec["representations"],
        file_format=run["checkpoints"]["format"],
        id_column=run["checkpoints"]["id_column"],
        dtype=spec["dtype"],
    )
    epochs.section_epochs(name, run, "features")
    check_stored_layers(name, run, epochs.analysis_epochs(name, run)[0])


def check_stored_layers(name: str, run: dict, epoch: int) -> None:
    """features.layers (names or patterns) against the columns of the first snapshot's train split
    (read from the files' schemas or headers, no values), before any job."""
    from epochlens.features.stored_columns import arrow_schema, file_columns, resolve_layers, split_columns
    from epochlens.features.stored_settings import detect_format

    ckpt = run["checkpoints"]
    folder = Path(ckpt["path"].format(index=run["indices"][0], epoch=epoch))
    try:
        fmt = detect_format(folder) if ckpt["format"] == "auto" else ckpt["format"]
    except FeatureError:
        return  # no activations there yet: the features job names the folder
    try:
        if fmt in ("save_to_disk", "parquet"):
            stored, others = split_columns(arrow_schema(folder, fmt), ckpt["id_column"])
        else:
            stored, others = file_columns(folder / "train", fmt, ckpt["id_column"])
        resolve_layers(stored, run["features"]["layers"], others, str(folder / "train"))
    except FeatureError as exc:
        raise ConfigError(f"runs.{name}.features.layers: {exc}") from None
