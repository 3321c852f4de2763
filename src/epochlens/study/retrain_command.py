"""LDS retrainings by the user's own training command (``checkpoints.source: command`` whose
command has ``{subset}``): what the workflow's ``lds_retrain`` jobs do for such a run.

The contract (README "Your own training script"): a command with ``{subset}`` trains on the
positions of ``{data}``'s x_train that the ``.npy`` file it is given lists (int64). For the run's
own training that file lists every non-holdout position; for LDS, each random subset of them
(:func:`epochlens.study.retrain.subset_masks`: the same subsets as a run the pipeline trains).

Each subset k is trained by the command, filled as for the run's training job of the index but
with ``{subset}`` that subset's file, ``{output}`` and ``{resume}`` folders of its own (kept
across attempts of the job, so a command that resumes from ``{resume}`` continues) and ``{seed}``
the run's seed of the index, so that only the data differs from the run's own training. When it
exits 0, the checkpoint of the analysed epoch (``checkpoints.path`` under ``{output}``, read with
``checkpoints.key``) goes into the user's model (``model.factory``, as every checkpoint job builds
it) and the test split is measured: a classifier's log-probabilities of every test sample over
the active classes (what :func:`epochlens.study.retrain.test_log_probs` gives a retraining of the
pipeline), a regression's loss of every test sample under its own target (the task's squared
error). The measurement is kept in the subset's folder, so a job killed after it does not train
that subset again; the command's checkpoints are deleted once measured.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from epochlens.atomic import save_npy
from epochlens.data import Dataset
from epochlens.formats import command as cmd
from epochlens.job import CheckpointJob
from epochlens.study.retrain import part_subsets, subset_masks, test_log_probs
from epochlens.tasks.regression import predict_regression

log = logging.getLogger("epochlens")

#: The files of a subset's folder.
SUBSET_FILE, STATE_FILE, MEASURED_FILE = "subset.npy", "command.json", "measured.npy"


@dataclass
class CommandRetraining:
    """How the training command retrains the LDS subsets of one analysed checkpoint."""

    spec: cmd.CommandSpec = field(metadata={"help": "the run's training command (its checkpoints section)"})
    index: int = field(metadata={"help": "the replicate index ({index})"})
    epoch: int = field(metadata={"help": "the analysed epoch: its checkpoint is measured"})
    seed: int = field(metadata={"help": "{seed}: the run's seed of the index, so only the data differs"})
    data_file: Path = field(metadata={"help": "{data}: the run's data set export (.npz)"})
    folder: Callable[[int], Path] = field(
        metadata={"help": "subset k -> its folder ({subset}, {output}, {resume}), kept across attempts"}
    )
    key: Mapping[str, Any] = field(
        default_factory=dict,
        metadata={"help": "what the retrainings depend on (params, digests of the command's files and "
                  "data): a kept folder made for other ones is emptied first"},
    )  # fmt: skip
    threads: int = field(default=1, metadata={"help": "{threads}"})
    log_file: str | None = field(default=None, metadata={"help": "the job's log, named in errors"})
    stream: TextIO | None = field(default=None, metadata={"help": "where the command's output goes (stderr)"})

    def what(self, subset: int) -> str:
        return f"index {self.index}, LDS retraining of subset {subset}"


def checkpoint_measure(
    data: Dataset,
    model: str | Mapping[str, Any],
    epoch: int,
    device: torch.device | str = "cpu",
    active: np.ndarray | None = None,
    reduction: str = "mean",
) -> Callable[[Path], np.ndarray]:
    """What a retrained checkpoint is measured by: the model (``model``: the config's model as
    :func:`epochlens.config.model_param` gives it, read with the checkpoint's key) with the
    checkpoint's weights, then a classifier's test log-probabilities (N_test, A) float32 over the
    ``active`` classes, or a regression's per-sample test losses (N_test,) float64 (squared error
    with ``reduction``) under the test targets."""
    device = torch.device(device)

    def measure(checkpoint: Path) -> np.ndarray:
        job = CheckpointJob(data, epoch, model, Path(checkpoint), device)
        net = job.build_model()
        if data.is_regression:
            inputs = data.normalized("test")
            return predict_regression(net, inputs, data.test_labels, reduction, device=device)[1]
        if active is None:
            raise ValueError("a classifier's retrainings are measured over its active classes: pass active")
        return test_log_probs(net, data, active, device)

    return measure


def retrain_subset(
    retraining: CommandRetraining, subset: int, positions: np.ndarray, measure: Callable[[Path], np.ndarray]
) -> np.ndarray:
    """Train ``subset`` (its ``positions`` in ``{data}``'s x_train) by the command and measure the
    checkpoint of the analysed epoch; a measurement kept from an earlier attempt (for the same
    command, files, data and subset) is returned without training again."""
    r, spec = retraining, retraining.spec
    folder = Path(r.folder(subset))
    output, resume, measured = folder / "output", folder / "resume", folder / MEASURED_FILE
    positions = np.asarray(positions, dtype=np.int64)
    key = cmd.fingerprint(
        {
            **r.key,
            "index": r.index,
            "epoch": r.epoch,
            "seed": r.seed,
            "subset": int(subset),
            "positions": hashlib.sha256(positions.tobytes()).hexdigest(),
        }
    )
    kept = cmd.prepare_attempt(folder / STATE_FILE, [output, resume], key)
    if not kept:
        measured.unlink(missing_ok=True)
    if measured.is_file():
        log.info("%s: measured by an earlier attempt of this job (%s)", r.what(subset), measured)
        return np.load(measured)
    values = {
        "index": r.index,
        "seed": r.seed,
        "output": output.resolve(),
        "resume": resume.resolve(),
        "data": Path(r.data_file).resolve(),
        "threads": r.threads,
        "subset": cmd.write_subset(folder / SUBSET_FILE, positions),
    }
    line = cmd.fill_command(spec.command, values)
    log.info(
        "%s: %s on %d training samples: %s",
        r.what(subset), "resuming" if kept else "training", len(positions), line,
    )  # fmt: skip
    result = cmd.run_streamed(line, stream=r.stream)
    if result.returncode != 0:
        raise cmd.CommandError(
            cmd.failure_message(spec, r.index, line, result, r.log_file, str(resume), what=r.what(subset))
        )
    checkpoint = cmd.written_checkpoints(spec, r.index, output, [r.epoch], what=r.what(subset))[r.epoch]
    value = measure(checkpoint)
    save_npy(measured, value)
    log.info("%s: trained in %.1f s, epoch %d measured", r.what(subset), result.seconds, r.epoch)
    shutil.rmtree(output, ignore_errors=True)  # the retraining's checkpoints: measured, not kept
    shutil.rmtree(resume, ignore_errors=True)
    return value


def retrain_part_by_command(
    retraining: CommandRetraining,
    holdout: np.ndarray,
    lds: Mapping[str, Any],
    part: int,
    parts: int,
    measure: Callable[[Path], np.ndarray],
    active: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Part ``part`` of ``parts`` of ``influence.lds``'s retrainings (``lds``: subsets, fraction,
    seed) by the command: the contents of its ``retrain_{k}-of-{P}.npz``: ``subset_ids`` (m,),
    ``masks`` (m, N) bool and, for a classifier (``active`` given), ``log_probs`` (m, N_test, A)
    float32 and ``active_classes`` (A,), as the pipeline's retrainings store them; for a
    regression (``active`` None), ``test_losses`` (m, N_test) float64."""
    eligible = ~np.asarray(holdout, dtype=bool)
    masks = subset_masks(eligible, lds["subsets"], lds["fraction"], lds["seed"])
    ids = part_subsets(lds["subsets"], part, parts)
    log.info(
        "LDS retrainings %s of %d at epoch %d (part %d of %d) by the training command, %.0f%% of %d "
        "training samples each",
        ids.tolist(), lds["subsets"], retraining.epoch, part + 1, parts, 100 * lds["fraction"],
        int(eligible.sum()),
    )  # fmt: skip
    measured = [retrain_subset(retraining, int(k), np.flatnonzero(masks[k]), measure) for k in ids]
    arrays = {"subset_ids": ids.astype(np.int64), "masks": masks[ids]}
    if active is None:
        arrays["test_losses"] = np.asarray(measured, np.float64).reshape(len(ids), -1)
        return arrays
    arrays["log_probs"] = np.asarray(measured, np.float32).reshape(len(ids), -1, len(active))
    arrays["active_classes"] = np.asarray(active, np.int64)
    return arrays


def remove_subset_folders(retraining: CommandRetraining, subsets: np.ndarray) -> None:
    """Delete the folders of ``subsets`` (once their part is written), and their parent when no
    other part's subsets are left in it."""
    parents = set()
    for k in subsets:
        folder = Path(retraining.folder(int(k)))
        shutil.rmtree(folder, ignore_errors=True)
        parents.add(folder.parent)
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:  # another part's subsets are still there
            pass


@dataclass
class CommandPart:
    """One lds_retrain job of a run trained by its command: what the job's files and settings are."""

    run_name: str
    run: Mapping[str, Any]  # the run's config section
    params: Mapping[str, Any]  # the job's run params (model, task, schedule, command)
    lds: Mapping[str, Any]
    index: int
    epoch: int
    part: int
    nparts: int
    files: list[Path]  # the command's files (pinned)
    dataset: Dataset
    data_file: Path  # the {data} export
    class_order: str | Path | None
    device: torch.device
    threads: int = 1
    log_file: str | Path | None = None


def command_part(job: CommandPart) -> tuple[dict[str, np.ndarray], dict[str, Any], CommandRetraining]:
    """Retrain the job's part of the subsets with the run's command (pinned to the commit its
    training was planned at) and measure each on the test split: (the part's arrays, its info,
    the retraining, whose subset folders the caller removes once the part is written)."""
    from epochlens.layout import RESULTS
    from epochlens.outcome import regression_reduction
    from epochlens.provenance import file_sha256, provenance
    from epochlens.schedule import schedule_from_config

    spec = cmd.CommandSpec.from_config(job.run_name, job.run)
    state = cmd.job_repository_state(spec, job.files)  # the commit the run was planned at
    inputs = {**cmd.file_digests(job.files, state.root), "{data}": file_sha256(job.data_file)}
    active = None
    if job.params["schedule"] is not None:  # a classifier: its classes at the epoch
        active = schedule_from_config(job.params["schedule"], job.class_order).active_classes(job.epoch)
    retraining = CommandRetraining(
        spec=spec, index=job.index, epoch=job.epoch, seed=cmd.seed_of(job.run, job.index),
        data_file=job.data_file,
        folder=lambda k: Path(RESULTS.lds_retrain_dir(job.run_name, job.index, job.epoch, k)),
        key={"params": job.params, "lds": job.lds, "inputs": inputs}, threads=job.threads,
        log_file=job.log_file,
    )  # fmt: skip
    reduction = regression_reduction(job.params["task"])
    measure = checkpoint_measure(job.dataset, job.params["model"], job.epoch, job.device, active, reduction)
    arrays = retrain_part_by_command(
        retraining, job.dataset.holdout, job.lds, job.part, job.nparts, measure, active
    )
    info = {
        "device": str(job.device),
        "git": state.record(),
        "provenance": provenance(job.params, {"dataset": job.dataset.content_hash, **inputs}),
    }
    return arrays, info, retraining
