"""The :class:`Dataset` of a run and the ``dataset.h5`` contract (torch-free; torch is imported
only by :meth:`Dataset.normalized`). The sources it is loaded from: :mod:`epochlens.data.sources`.

Two kinds of data (``kind``):

* ``classification``: labels are class ids (N,) int64;
* ``regression``: labels are continuous targets, (N,) or (N, D), kept in their stored float dtype
  (never cast); no classes (``num_classes`` 0). Every stage reads them as the targets of the
  run's regression task (per-sample loss: squared error, :class:`epochlens.tasks.RegressionTask`).

Inputs are images (N, C, H, W) or any other array of samples (N, ...), e.g. vectors (N, D) of a
tabular data set; axis 1 is the "channel" that ``mean`` and ``std`` normalise.

``dataset.h5`` layout (inputs kept in their stored dtype; normalisation is applied on load)::

    /train/images  (N, C, H, W) or (N, ...)  uint8 or float
    /train/labels  (N,) int64 class ids, or float targets (N,) / (N, D)
    /train/holdout (N,)          bool   first ``holdout_per_class`` samples of each class (regression:
                                        the first ``holdout_per_class`` samples)
    /train/ground_truth (N,)     bool   optional: your poisoned samples (data.ground_truth)
    /test/images, /test/labels
    attrs: name, source, kind, num_classes, class_names (JSON), scale, mean (C,), std (C,),
           content_hash (a file without ``kind`` holds classification data)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from epochlens.atomic_hdf5 import atomic_h5
from epochlens.data.blocks import copy_rows, update_hash
from epochlens.errors import DataError

if TYPE_CHECKING:
    import torch


DATA_KINDS = ("classification", "regression")


@dataclass
class Dataset:
    """Train/test inputs and labels (class ids or regression targets) plus how to normalise them.

    Normalised input = (input * scale - mean[c]) / std[c], c the index along axis 1 (an image's
    channel, a vector's feature; a mean and std of length 1 apply to every c).
    """

    name: str
    source: str
    train_images: np.ndarray  # (N, C, H, W)
    train_labels: np.ndarray  # (N,) int64
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    holdout: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    class_names: list[str] = field(default_factory=list)
    # Optional cohort of every sample from a data column (e.g. the source of each image): int64
    # indices into group_names, for "by group" tables. None for data without groups.
    train_groups: np.ndarray | None = None  # (N_train,) int64
    test_groups: np.ndarray | None = None  # (N_test,) int64
    group_names: list[str] = field(default_factory=list)
    kind: str = "classification"  # or "regression": labels are float targets (N,) or (N, D)
    # Your ground truth (data.ground_truth): (N_train,) bool, True for each poisoned or corrupted
    # training sample; None without one. Not part of the content hash (no model sees it).
    ground_truth: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise ValueError(f"kind must be one of {DATA_KINDS}, not {self.kind!r}")
        if self.kind == "regression":
            self.train_labels, self.test_labels = check_targets(self.train_labels, self.test_labels)
            self.num_classes, self.class_names = 0, []
        else:
            self.train_labels = np.asarray(self.train_labels, dtype=np.int64)
            self.test_labels = np.asarray(self.test_labels, dtype=np.int64)
        if len(self.holdout) == 0:
            self.holdout = np.zeros(len(self.train_labels), dtype=bool)
        if not self.class_names:
            self.class_names = [str(c) for c in range(self.num_classes)]
        if self.ground_truth is not None and np.shape(self.ground_truth) != (len(self.train_labels),):
            raise ValueError(
                f"ground_truth has shape {np.shape(self.ground_truth)}, train labels {len(self.train_labels)}"
            )
        if (self.train_groups is None) != (self.test_groups is None):
            raise ValueError("train_groups and test_groups must both be given or both be None")
        if self.train_groups is not None:
            self.train_groups = np.asarray(self.train_groups, dtype=np.int64)
            self.test_groups = np.asarray(self.test_groups, dtype=np.int64)
            for split, groups, labels in (
                ("train", self.train_groups, self.train_labels),
                ("test", self.test_groups, self.test_labels),
            ):
                if groups.shape != labels.shape[:1]:
                    raise ValueError(f"{split}_groups has shape {groups.shape}, labels {labels.shape}")
            n = max(int(self.train_groups.max(initial=-1)), int(self.test_groups.max(initial=-1))) + 1
            if not self.group_names:
                self.group_names = [str(g) for g in range(n)]
            if len(self.group_names) < n:
                raise ValueError(f"group ids up to {n - 1} but only {len(self.group_names)} group_names")

    @property
    def content_hash(self) -> str:
        """SHA-256 of the images and labels of both splits (what the numbers depend on), and of the
        groups when there are any (data without groups keeps its hash)."""
        h = hashlib.sha256()
        arrays = [self.train_images, self.train_labels, self.test_images, self.test_labels]
        if self.train_groups is not None:
            arrays += [self.train_groups, self.test_groups]
        for arr in arrays:
            update_hash(h, arr)
        if self.train_groups is not None:
            h.update(json.dumps(self.group_names).encode())
        return h.hexdigest()

    def groups(self, split: str) -> np.ndarray | None:
        """Group index (N,) int64 of every sample of ``split``; None for data without groups."""
        return self.train_groups if _check_split(split) == "train" else self.test_groups

    @property
    def is_regression(self) -> bool:
        return self.kind == "regression"

    def normalized(self, split: str, indices: np.ndarray | None = None) -> torch.Tensor:
        """Float32 tensor (N, C, H, W) (or (N, ...): the stored inputs' shape) of normalised inputs
        of ``split`` ("train" or "test")."""
        import torch  # here, not at the top: tables and figures read data sets without torch

        images = self.train_images if _check_split(split) == "train" else self.test_images
        if indices is not None:
            images = images[indices]
        x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32) * self.scale
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(shape)
        std = torch.tensor(self.std, dtype=torch.float32).view(shape)
        return (x - mean) / std

    def labels(self, split: str) -> np.ndarray:
        """Class ids (N,) int64, or regression targets (N,) / (N, D) in their stored dtype."""
        return self.train_labels if _check_split(split) == "train" else self.test_labels


def check_targets(train: np.ndarray, test: np.ndarray, origin: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Regression targets of both splits as they are stored: float, (N,) or (N, D) with the same D,
    finite. Raises DataError naming ``origin`` (the file) and the fix."""
    where = f"{origin}: " if origin else ""
    out = []
    for split, y in (("train", train), ("test", test)):
        y = np.asarray(y)
        if not np.issubdtype(y.dtype, np.floating):
            raise DataError(
                f"{where}the {split} targets are {y.dtype}, not floats: integer labels are class ids. "
                "Use task: classification for them, or store the targets as floats "
                "(e.g. y.astype(np.float32)) for a regression."
            )
        if y.ndim not in (1, 2):
            raise DataError(
                f"{where}the {split} targets have shape {y.shape}; a regression's targets are (N,) or "
                "(N, D): flatten each sample's target (e.g. y.reshape(len(y), -1))."
            )
        bad = np.flatnonzero(~np.isfinite(y.reshape(len(y), -1)).all(1))
        if len(bad):
            raise DataError(
                f"{where}{len(bad)} {split} target(s) are NaN or Inf (rows {bad[:10].tolist()}); "
                "drop or fix those samples."
            )
        out.append(y)
    if out[0].shape[1:] != out[1].shape[1:]:
        raise DataError(f"{where}train targets {out[0].shape[1:]} per sample but test {out[1].shape[1:]}.")
    return out[0], out[1]


def check_kind(dataset: Dataset, task: str) -> None:
    """The data's labels against the run's task (before anything is written): float targets go with
    ``task: regression``, class ids with every other task. Raises DataError naming the data's
    source and the fix."""
    kind = getattr(dataset, "kind", "classification")
    if task == "regression" and kind != "regression":
        raise DataError(
            f"{dataset.source}: task regression, but the data's labels are integers (class ids). Store "
            "the targets as floats (e.g. y.astype(np.float32); a table's target_columns as float "
            "columns), or use task: classification."
        )
    if task != "regression" and kind == "regression":
        raise DataError(
            f"{dataset.source}: the labels are float targets (a regression's), but the run's task is "
            f"{task}: set the run's task: regression (with model.factory and schedule: none), or store "
            "class ids as integers (y.astype(np.int64))."
        )


def target_dim(targets: np.ndarray) -> int:
    """Values per sample of regression targets (N,) or (N, D): 1 or D."""
    return 1 if np.ndim(targets) == 1 else int(np.shape(targets)[1])


def _check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def holdout_mask(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Boolean mask of the first ``per_class`` samples of each class, in data order.

    This is the loss-of-plasticity validation split (first 50 training images per class), used for
    early stopping and excluded from training. Regression targets (float labels) have no classes:
    the first ``per_class`` samples.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):  # token labels: one class
        labels = np.zeros(len(labels), dtype=np.int64)
    mask = np.zeros(len(labels), dtype=bool)
    if per_class <= 0:
        return mask
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) <= per_class:
            raise DataError(
                f"class {c} has {len(idx)} training samples, not more than holdout_per_class="
                f"{per_class}; lower data.holdout_per_class in the config."
            )
        mask[idx[:per_class]] = True
    return mask


def write_dataset(dataset: Dataset, path: str | Path) -> None:
    """Write ``dataset`` to ``path`` (dataset.h5), atomically."""
    with atomic_h5(path) as f:
        for split, images, labels in (
            ("train", dataset.train_images, dataset.train_labels),
            ("test", dataset.test_images, dataset.test_labels),
        ):
            g, chunks = f.create_group(split), (min(len(images), 256), *images.shape[1:])
            stored = g.create_dataset("images", images.shape, images.dtype, chunks=chunks, compression="gzip")
            copy_rows(images, stored)  # a block at a time (images spilled to disk are never read whole)
            g.create_dataset("labels", data=labels)
        f["train"].create_dataset("holdout", data=dataset.holdout)
        if dataset.ground_truth is not None:  # your own poisoned samples (not hashed)
            f["train"].create_dataset("ground_truth", data=np.asarray(dataset.ground_truth, bool))
        if dataset.train_groups is not None:  # optional: cohorts from a data column
            f["train"].create_dataset("groups", data=dataset.train_groups)
            f["test"].create_dataset("groups", data=dataset.test_groups)
            f.attrs["group_names"] = json.dumps(dataset.group_names)
        f.attrs.update(
            name=dataset.name,
            source=dataset.source,
            kind=dataset.kind,
            num_classes=dataset.num_classes,
            class_names=json.dumps(dataset.class_names),
            scale=dataset.scale,
            mean=np.asarray(dataset.mean),
            std=np.asarray(dataset.std),
            content_hash=dataset.content_hash,
        )


def read_dataset(path: str | Path) -> Dataset:
    """Read a ``dataset.h5`` written by :func:`write_dataset`."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            ds = Dataset(
                name=str(f.attrs["name"]),
                source=str(f.attrs["source"]),
                train_images=f["train/images"][()],
                train_labels=f["train/labels"][()],
                test_images=f["test/images"][()],
                test_labels=f["test/labels"][()],
                num_classes=int(f.attrs["num_classes"]),
                scale=float(f.attrs["scale"]),
                mean=tuple(float(v) for v in f.attrs["mean"]),
                std=tuple(float(v) for v in f.attrs["std"]),
                holdout=f["train/holdout"][()],
                class_names=json.loads(f.attrs["class_names"]),
                train_groups=f["train/groups"][()] if "groups" in f["train"] else None,
                test_groups=f["test/groups"][()] if "groups" in f["test"] else None,
                group_names=json.loads(f.attrs.get("group_names", "[]")),
                kind=str(f.attrs.get("kind", "classification")),
                ground_truth=f["train/ground_truth"][()] if "ground_truth" in f["train"] else None,
            )
            stored_hash = str(f.attrs["content_hash"])
    except (OSError, KeyError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc
    if ds.content_hash != stored_hash:
        raise DataError(f"{path}: content hash mismatch; the file is corrupt. Delete and rerun.")
    return ds


def describe(dataset: Any) -> str:
    """One line on a data set (a :class:`Dataset` or a text data set) for the logs: its splits,
    inputs, labels or targets and hash."""
    text = hasattr(dataset, "train_input_ids")
    shape = (dataset.train_input_ids if text else dataset.train_images).shape[1:]
    labels = dataset.train_labels
    regression = getattr(dataset, "kind", "") == "regression"
    what = f"{labels.dtype} targets {labels.shape[1:]}" if regression else f"{dataset.num_classes} classes"
    return (
        f"{dataset.name}: {len(labels)} train ({int(dataset.holdout.sum())} holdout) / "
        f"{len(dataset.test_labels)} test {'texts of tokens' if text else 'inputs'} {tuple(shape)}, "
        f"{what}, hash {dataset.content_hash[:12]}"
    )
