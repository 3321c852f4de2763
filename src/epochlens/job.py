"""One checkpoint job: what every per-checkpoint stage (evaluation, curvature, features, ablation,
influence) works from, loaded in one place.

:func:`load_checkpoint_job` opens the run's data set (an image data set by rows, read as the
job asks for them: :func:`epochlens.data.rows.open_dataset`) and class order, derives the classes the
checkpoint was trained on (``active``) and those of its newest task (``new``), resolves the device
(an execution setting: it never changes results, so it is read from the config and recorded in
the results' metadata; a job not given a GPU computes on the CPU, see epochlens.resources) and
builds the model with the checkpoint's weights when first asked for (a features cache hit never
loads it). :meth:`CheckpointJob.input_hashes` gives the hashes that
results record as provenance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from epochlens.checkpoints import load_into
from epochlens.data import Dataset
from epochlens.data.dataset import target_dim
from epochlens.data.text import TextDataset
from epochlens.data.text_rows import open_any_dataset
from epochlens.device import job_device
from epochlens.errors import CheckpointError
from epochlens.models.networks import build_model
from epochlens.provenance import file_sha256
from epochlens.schedule import ClassSchedule, schedule_from_config


@dataclass
class CheckpointJob:
    """A checkpoint of a run with its data, classes and device.

    Attributes:
        data: the run's data set (``dataset.h5``: images, or tokenised text for a text run).
        epoch: the checkpoint's epoch.
        model_name: the config's ``model.name``, or a mapping (:func:`epochlens.config.model_param`):
            your model (``factory``, ``kwargs``, ``project_path``, ``output``) or a built-in ``name``,
            with the checkpoint's ``key`` and ``strip_prefix``.
        checkpoint: the checkpoint file.
        device: where the job computes (resolved from the config's ``device``).
        schedule: the class schedule of this replicate (None without a class order).
        class_order: the replicate's ``class_order.npy`` (None when the job needs no classes).
        active: (A,) int64 classes trained at ``epoch``, in order of introduction (None likewise).
        new: int64 classes of the newest task at ``epoch`` (a subset of ``active``).
    """

    data: Dataset | TextDataset
    epoch: int
    model_name: str | Mapping[str, Any]
    checkpoint: Path
    device: torch.device
    schedule: ClassSchedule | None = None
    class_order: Path | None = None
    active: np.ndarray | None = field(default=None, repr=False)
    new: np.ndarray | None = field(default=None, repr=False)

    @property
    def in_channels(self) -> int:
        return int(self.data.train_images.shape[1]) if isinstance(self.data, Dataset) else 0

    def factory_defaults(self) -> dict[str, int]:
        """What your model's factory is given where it accepts it and model.kwargs does not set it:
        ``num_classes``, ``in_channels`` (axis 1 of the inputs), ``in_features`` (values per input
        sample) and, for regression data, ``num_outputs`` (values per target)."""
        defaults = {"num_classes": self.data.num_classes, "in_channels": self.in_channels}
        if isinstance(self.data, Dataset):
            defaults["in_features"] = int(np.prod(self.data.train_images.shape[1:]))
            if self.data.is_regression:
                defaults["num_outputs"] = target_dim(self.data.train_labels)
        return defaults

    def build_model(self, checkpoint: str | Path | None = None) -> nn.Module:
        """The model with the weights of ``checkpoint`` (default: the job's), on the CPU.

        Your model (``model.factory``) returns its logits whatever its forward returns (a forward
        hook picks ``model.output``; module names are unchanged), and its checkpoint's keys must
        fit exactly: the error lists missing and unexpected keys and the prefix to strip."""
        path = Path(checkpoint or self.checkpoint)
        spec = self.model_name
        if isinstance(spec, Mapping) and "hf" in spec:
            return self._build_hf_model(path, spec["hf"])
        if isinstance(spec, str):
            return load_into(build_model(spec, self.data.num_classes, self.in_channels), path)
        from epochlens.formats.weights import fit_weights, load_weights

        if "factory" in spec:
            from epochlens.formats.factory import FactorySpec, check_trained_with
            from epochlens.formats.user_model import attach_output_adapter, build_user_model

            factory = FactorySpec.from_config(spec)
            check_trained_with(factory, path)
            model = build_user_model(factory, self.factory_defaults())
            attach_output_adapter(model, factory.output)
        else:
            model = build_model(spec["name"], self.data.num_classes, self.in_channels)
        state = load_weights(path, spec.get("key"))
        try:
            fit_weights(model, state, source=path, strip=spec.get("strip_prefix"))
            return model
        except CheckpointError:
            pass
        # Again (outside the handler: one error, not two), naming the closest of the models the
        # config could mean; the candidates are built only for a checkpoint that does not fit.
        fit_weights(
            model,
            state,
            source=path,
            strip=spec.get("strip_prefix"),
            candidates=self._candidates(model, spec),
        )
        return model

    def _build_hf_model(self, path: Path, hf: Mapping[str, Any]) -> nn.Module:
        """A Hugging Face transformer (``model.hf``: ``task``, ``attention``) with the weights of the
        checkpoint folder or file, returning its logits (as every model a job builds does)."""
        from epochlens.formats.user_model import attach_output_adapter
        from epochlens.models.hf import load_hf_model

        task = hf.get("task", "sequence_classification")
        model = load_hf_model(
            path,
            task=task,
            num_labels=self.data.num_classes if task == "sequence_classification" else None,
            pad_token_id=getattr(self.data, "pad_token_id", None),
            config=hf.get("config"),
            attention=hf.get("attention", "eager"),
            vocab_size=getattr(self.data, "vocab_size", None) or None,
        )
        attach_output_adapter(model, "logits")
        if isinstance(self.data, TextDataset):
            rows = model.get_input_embeddings().num_embeddings
            top = self.data.max_token_id()
            if top >= rows:
                raise CheckpointError(
                    f"{path}: the data's token ids reach {top} but the model has {rows} token embeddings: "
                    f"the data was tokenised with another tokenizer ({self.data.tokenizer}). Point "
                    "data.text.tokenizer at the model's own tokenizer folder and rerun prepare_data."
                )
        return model

    def _candidates(self, model: nn.Module, spec: Mapping[str, Any]) -> dict[str, dict[str, tuple[int, ...]]]:
        """Key shapes of the configured model and of every built-in network for this data."""
        from epochlens.formats.weights import shapes_of
        from epochlens.models.networks import MODELS

        configured = (
            f"model.factory: {spec['factory']}" if "factory" in spec else f"model.name: {spec['name']}"
        )
        candidates = {configured: shapes_of(model)}
        if isinstance(self.data, Dataset) and self.data.is_regression:
            return candidates  # the built-in networks are classifiers
        for name in MODELS:
            if name != spec.get("name"):
                candidates[f"model.name: {name}"] = shapes_of(
                    build_model(name, self.data.num_classes, self.in_channels)
                )
        return candidates

    @cached_property
    def model(self) -> nn.Module:
        """The job's model with its checkpoint loaded (built on first use)."""
        return self.build_model()

    @cached_property
    def checkpoint_sha256(self) -> str:
        """SHA-256 of the checkpoint file, or of the weights of a checkpoint folder (a Trainer
        ``checkpoint-{step}/`` or ``save_pretrained`` folder; a sharded model: its index)."""
        if self.checkpoint.is_dir():
            from epochlens.formats.trainer_folders import weights_file

            return file_sha256(weights_file(self.checkpoint))
        return file_sha256(self.checkpoint)

    def active_at(self, epoch: int) -> np.ndarray:
        """Classes trained at another checkpoint of the same replicate (TracIn)."""
        assert self.schedule is not None, "a job without a class order has no schedule"
        return self.schedule.active_classes(epoch)

    def input_hashes(self) -> dict[str, str]:
        """Provenance of the inputs: the data set's content hash, class order and checkpoint SHA-256."""
        hashes = {"dataset": self.data.content_hash}
        if self.class_order is not None:
            hashes["class_order"] = file_sha256(self.class_order)
        hashes["checkpoint"] = self.checkpoint_sha256
        if isinstance(self.model_name, Mapping) and "factory" in self.model_name:
            from epochlens.formats.factory import FactorySpec, factory_fingerprint

            hashes["model_code"] = factory_fingerprint(FactorySpec.from_config(self.model_name))
        return hashes


def load_checkpoint_job(
    dataset: str | Path,
    checkpoint: str | Path,
    model: str | Mapping[str, Any],
    epoch: int | str,
    device: str = "auto",
    class_order: str | Path | None = None,
    schedule: dict | None = None,
    resources: Mapping[str, Any] | None = None,
) -> CheckpointJob:
    """Load the checkpoint job of one (run, index, epoch).

    Args:
        dataset: the run's ``dataset.h5``.
        checkpoint: the checkpoint file.
        model: the config's ``model.name``, or the mapping of :func:`epochlens.config.model_param`
            (your model, or a built-in read with a checkpoint key or prefix).
        epoch: the checkpoint's epoch (an int or the ``{epoch}`` wildcard's digits).
        device: the config's ``device`` (``auto``, ``cpu``, ``cuda:1``, ...).
        class_order: the replicate's ``class_order.npy``; with ``schedule`` (the config's
            ``schedule`` section) it gives the active and new classes.
        schedule: the config's ``schedule`` section.
        resources: the workflow job's resources: ``device`` applies when they give it a GPU, the
            job computes on the CPU otherwise (:func:`epochlens.device.job_device`).

    Raises:
        DataError, ClassOrderError, ConfigError: unreadable inputs or an unavailable device,
        naming the file or key.
    """
    epoch = int(epoch)
    job = CheckpointJob(
        data=open_any_dataset(dataset),
        epoch=epoch,
        model_name=model,
        checkpoint=Path(checkpoint),
        device=job_device(device, resources),
    )
    if class_order is not None and schedule is not None:
        job.class_order = Path(class_order)
        job.schedule = schedule_from_config(schedule, class_order)
        job.active = job.schedule.active_classes(epoch)
        job.new = job.schedule.new_classes(epoch)
    return job
