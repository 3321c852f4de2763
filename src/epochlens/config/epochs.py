"""Which checkpoints a run has and which of them (and of its indices) each stage analyses
(torch-free).

Every function takes a run's section of a validated configuration (``config["runs"][name]``,
defaults filled in) and names the config key to fix in its errors.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import numpy as np

from epochlens.errors import ConfigError, DataError
from epochlens.schedule import ClassSchedule, is_no_schedule


def listed_epochs(run_cfg: dict) -> list[int]:
    """The ``{epoch}`` values of the checkpoint files on disk (``checkpoints.path`` with the run's
    first index): the checkpoints of a run without a schedule."""
    ckpt = run_cfg.get("checkpoints", {})
    if ckpt.get("source", "train") not in ("folder", "activations"):
        raise ConfigError(
            "schedule: none needs checkpoints.source: folder (the pipeline trains class-incremental "
            "schedules only); point checkpoints.path at your checkpoints, or have the pipeline run "
            "your training script (checkpoints.source: command)."
        )
    template = ckpt["path"].replace("{index}", str(run_cfg.get("indices", [0])[0]))
    field = re.search(r"\{epoch(:[^}]*)?\}", template)
    before, after = template[: field.start()], template[field.end() :]
    pattern = re.compile(re.escape(before) + r"(\d+)" + re.escape(after))
    found = set()
    for path in glob.glob(glob.escape(before) + "*" + glob.escape(after)):
        m = pattern.fullmatch(path)
        if m:
            found.add(int(m.group(1)))
    folder = Path(before).parent
    if not found and ckpt.get("source") == "activations":
        raise ConfigError(
            f"checkpoints.path {ckpt['path']!r}: no snapshot folder of stored activations matches "
            f"{template!r} (folder {folder.resolve()}); each {{epoch}} folder is one snapshot. Fix "
            "checkpoints.path (relative to the working directory) or store the activations."
        )
    if not found:
        raise ConfigError(
            f"checkpoints.path {ckpt['path']!r}: no checkpoint matches {template!r} (folder "
            f"{folder.resolve()}). With schedule: none the checkpoints are the files found there: "
            "fix checkpoints.path (relative to the working directory) or write the checkpoints."
        )
    return sorted(found)


def command_epochs(run_cfg: dict) -> list[int]:
    """The checkpoints of a run whose training command the pipeline runs: its ``epochs`` (the
    outputs of the command's job are planned before it runs, so they are listed, not found)."""
    chosen = run_cfg.get("epochs")
    if not chosen:
        raise ConfigError(
            "checkpoints.source: command needs the run's epochs: [...] (the epochs whose checkpoints "
            "the command writes, e.g. [0, 50, 100]): the pipeline plans them before the command runs."
        )
    return sorted(int(e) for e in chosen)


KNOWN_NUM_CLASSES = {"digits": 10, "cifar100": 100, "polarity": 2}


def num_classes(data_cfg: dict) -> int:
    """Number of classes of the configured data set, known before the data rule runs."""
    source = data_cfg["source"]
    if source in KNOWN_NUM_CLASSES:
        return KNOWN_NUM_CLASSES[source]
    if data_cfg.get("num_classes"):
        return int(data_cfg["num_classes"])
    if source == "imagefolder":
        split = Path(data_cfg["path"]) / data_cfg.get("images", {}).get("train_split", "train")
        if not split.is_dir():
            raise DataError(
                f"{split}: no such folder. An imagefolder source is path/<split>/<class_name>/*.png; "
                "point data.path at the folder holding the split folders (or set "
                "data.images.train_split)."
            )
        classes = [p for p in split.iterdir() if p.is_dir() and not p.name.startswith(".")]
        if not classes:
            raise DataError(f"{split}: no class folders; an imagefolder split holds <class_name>/ folders.")
        return len(classes)
    if source in ("save_to_disk", "parquet", "jsonl", "csv"):
        raise ConfigError(
            f"data.source: {source} with a class-incremental schedule: set data.num_classes (the "
            "classes are known only once the data is read), or use schedule: none."
        )
    path = Path(data_cfg["path"])
    if not path.is_file():
        raise DataError(f"{path}: data.path not found. Point data.path at an existing .npz file.")
    with np.load(path, allow_pickle=False) as archive:
        if "y_train" not in archive.files:
            raise DataError(f"{path}: no y_train array; see epochlens.data.load_npz for the layout.")
        return int(archive["y_train"].max()) + 1


def schedule(run_cfg: dict, class_order: np.ndarray | None = None) -> ClassSchedule:
    """The run's class schedule; without ``class_order`` the identity order (for epoch lists). A
    text-to-text run has one class, its target tokens."""
    if class_order is None:
        token_labels = run_cfg.get("model", {}).get("hf", {}).get("task") in ("causal_lm", "text_to_text")
        class_order = np.arange(1 if token_labels else num_classes(run_cfg["data"]))
    s = run_cfg["schedule"]
    return ClassSchedule(class_order, s["initial_classes"], s["increment"], s["epochs_per_task"])


def checkpoint_epochs(run_cfg: dict) -> list[int]:
    """Epochs that have a checkpoint (when the pipeline trains) or are expected to (a folder).

    With ``schedule: none`` they are the epochs of the files found in the folder (``checkpoints.path``
    with the run's first index), since no schedule says where they are."""
    ckpt = run_cfg.get("checkpoints", {})
    if ckpt.get("source") == "command":  # the epochs the user's command writes (README)
        return command_epochs(run_cfg)
    if ckpt.get("source") == "activations":  # one snapshot folder per epoch
        return listed_epochs(run_cfg)
    if is_no_schedule(run_cfg["schedule"]):
        return listed_epochs(run_cfg)
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


#: Which analysed epochs a section without ``epochs`` covers: every one, or the last (influence,
#: whose cost per checkpoint is highest).
SECTION_DEFAULT_EPOCHS = {"influence": "last"}


def section_epochs(run_name: str, run_cfg: dict, section: str) -> list[int]:
    """Epochs of a per-checkpoint analysis ``section`` (``curvature``, ``features``, ``ablation``,
    ``influence``): its ``epochs``, or by default every analysed epoch (the last one for the
    sections of :data:`SECTION_DEFAULT_EPOCHS`); none when the section is disabled."""
    analysed = analysis_epochs(run_name, run_cfg)
    spec = run_cfg.get(section) or {}
    if not spec.get("enabled", True):
        return []
    chosen = spec.get("epochs")
    if not chosen:
        return analysed[-1:] if SECTION_DEFAULT_EPOCHS.get(section) == "last" else analysed
    unknown = sorted(set(chosen) - set(analysed))
    if unknown:
        raise ConfigError(
            f"runs.{run_name}.{section}.epochs: {unknown} are not analysed epochs of this run "
            f"({analysed}); pick from those or change runs.{run_name}.epochs."
        )
    return sorted(chosen)


def curvature_epochs(run_name: str, run_cfg: dict) -> list[int]:
    """Epochs whose curvature is computed: ``curvature.epochs``, or every analysed epoch."""
    return section_epochs(run_name, run_cfg, "curvature")


def lds_start_epoch(run_cfg: dict, epoch: int) -> int | None:
    """The run's checkpoint epoch that the LDS retrainings of ``epoch`` start from: the one before
    it with ``influence.lds.start: previous``, None from scratch (or when there is none before)."""
    if run_cfg["influence"]["lds"].get("start", "scratch") != "previous":
        return None
    earlier = [e for e in checkpoint_epochs(run_cfg) if e < int(epoch)]
    return max(earlier) if earlier else None


def influence_epochs(run_name: str, run_cfg: dict) -> list[int]:
    """Epochs whose influence is computed: ``influence.epochs``, or the last analysed epoch."""
    return section_epochs(run_name, run_cfg, "influence")


def influence_indices(run_name: str, run_cfg: dict) -> list[int]:
    """Replicate indices whose influence is computed: ``influence.indices`` (some of the run's
    indices, in the run's order), or every index of the run."""
    indices = list(run_cfg.get("indices", [0]))
    chosen = (run_cfg.get("influence") or {}).get("indices")
    if chosen is None:
        return indices
    unknown = sorted(set(chosen) - set(indices))
    if unknown:
        raise ConfigError(
            f"runs.{run_name}.influence.indices: {unknown} are not indices of this run ({indices}); "
            f"pick from those, or null for every index."
        )
    return [i for i in indices if i in chosen]


def probe_epochs(run_name: str, run_cfg: dict) -> list[int]:
    """Epochs whose features are probed: those of the features, when probes are enabled."""
    return section_epochs(run_name, run_cfg, "features") if run_cfg["probes"]["enabled"] else []


def tracin_epochs(run_name: str, run_cfg: dict, epoch: int) -> list[int]:
    """Checkpoints whose gradient dot products TracIn sums for influence at ``epoch``: those of
    ``influence.tracin_epochs`` up to it, or every analysed epoch after the first up to it.
    """
    analysed = analysis_epochs(run_name, run_cfg)
    chosen = run_cfg["influence"].get("tracin_epochs")
    if chosen is None:
        return [e for e in analysed if analysed[0] < e <= epoch] or [epoch]
    unknown = sorted(set(chosen) - set(analysed))
    if unknown:
        raise ConfigError(
            f"runs.{run_name}.influence.tracin_epochs: {unknown} are not analysed epochs of this run "
            f"({analysed}); pick from those."
        )
    upto = sorted(e for e in chosen if e <= epoch)
    if not upto:
        raise ConfigError(
            f"runs.{run_name}.influence.tracin_epochs: none is at or before influence epoch {epoch}; "
            "add one, or leave tracin_epochs: null."
        )
    return upto
