"""Data sets: loading the supported sources and the ``dataset.h5`` contract.

Sources:
    * ``digits``: scikit-learn's bundled 8x8 handwritten digits (no download), split into train/test
      with a seeded stratified split.
    * ``cifar100``: a ``cifar-100-python`` folder in its original pickle layout (files ``train``,
      ``test``, ``meta``; ``data`` uint8 (N, 3072) as R, G, B planes; ``fine_labels``).
    * ``npz``: a generic ``.npz`` with ``x_train``, ``y_train``, ``x_test``, ``y_test``; images as
      (N, H, W), (N, C, H, W) or (N, H, W, C) with ``layout: nhwc``.

``dataset.h5`` layout (images kept in their stored dtype; normalisation is applied on load)::

    /train/images  (N, C, H, W)  uint8 or float32
    /train/labels  (N,)          int64
    /train/holdout (N,)          bool   first ``holdout_per_class`` images of each class
    /test/images, /test/labels
    attrs: name, source, num_classes, class_names (JSON), scale, mean (C,), std (C,), content_hash
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch

from epochlens.atomic import atomic_path
from epochlens.errors import DataError

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


@dataclass
class Dataset:
    """Train/test images and labels plus how to normalise them.

    Normalised pixel = (image * scale - mean[c]) / std[c].
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

    def __post_init__(self) -> None:
        self.train_labels = np.asarray(self.train_labels, dtype=np.int64)
        self.test_labels = np.asarray(self.test_labels, dtype=np.int64)
        if len(self.holdout) == 0:
            self.holdout = np.zeros(len(self.train_labels), dtype=bool)
        if not self.class_names:
            self.class_names = [str(c) for c in range(self.num_classes)]
        if (self.train_groups is None) != (self.test_groups is None):
            raise ValueError("train_groups and test_groups must both be given or both be None")
        if self.train_groups is not None:
            self.train_groups = np.asarray(self.train_groups, dtype=np.int64)
            self.test_groups = np.asarray(self.test_groups, dtype=np.int64)
            for split, groups, labels in (
                ("train", self.train_groups, self.train_labels),
                ("test", self.test_groups, self.test_labels),
            ):
                if groups.shape != labels.shape:
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
            a = np.ascontiguousarray(arr)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
        if self.train_groups is not None:
            h.update(json.dumps(self.group_names).encode())
        return h.hexdigest()

    def groups(self, split: str) -> np.ndarray | None:
        """Group index (N,) int64 of every sample of ``split``; None for data without groups."""
        return self.train_groups if _check_split(split) == "train" else self.test_groups

    def normalized(self, split: str, indices: np.ndarray | None = None) -> torch.Tensor:
        """Float32 tensor (N, C, H, W) of normalised images of ``split`` ("train" or "test")."""
        images = self.train_images if _check_split(split) == "train" else self.test_images
        if indices is not None:
            images = images[indices]
        x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32) * self.scale
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        return (x - mean) / std

    def labels(self, split: str) -> np.ndarray:
        return self.train_labels if _check_split(split) == "train" else self.test_labels


def _check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def holdout_mask(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Boolean mask of the first ``per_class`` samples of each class, in data order.

    This is the loss-of-plasticity validation split (first 50 training images per class), used for
    early stopping and excluded from training.
    """
    labels = np.asarray(labels)
    mask = np.zeros(len(labels), dtype=bool)
    if per_class <= 0:
        return mask
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) <= per_class:
            raise DataError(
                f"class {c} has {len(idx)} training images, not more than holdout_per_class="
                f"{per_class}; lower data.holdout_per_class in the config."
            )
        mask[idx[:per_class]] = True
    return mask


def channel_stats(images: np.ndarray, scale: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``images * scale`` (N, C, H, W)."""
    x = images.astype(np.float64) * scale
    mean = x.mean(axis=(0, 2, 3))
    std = x.std(axis=(0, 2, 3))
    std[std == 0] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def load_digits(test_fraction: float = 0.25, split_seed: int = 0) -> Dataset:
    """scikit-learn's bundled digits (1797 images, 8x8, values 0..16), stratified train/test split."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_load_digits()
    images = bunch.images.astype(np.uint8)[:, None, :, :]  # (N, 1, 8, 8), values 0..16
    labels = bunch.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, stratify=labels, random_state=split_seed
    )
    idx_train.sort()
    idx_test.sort()
    scale = 1.0 / 16.0
    mean, std = channel_stats(images[idx_train], scale)
    return Dataset(
        name="digits",
        source="sklearn.datasets.load_digits",
        train_images=images[idx_train],
        train_labels=labels[idx_train],
        test_images=images[idx_test],
        test_labels=labels[idx_test],
        num_classes=10,
        scale=scale,
        mean=mean,
        std=std,
        class_names=[str(d) for d in range(10)],
    )


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise DataError(
            f"{path}: not a readable CIFAR pickle ({type(exc).__name__}: {exc}). Re-extract "
            "cifar-100-python.tar.gz into this folder."
        ) from exc


CIFAR100_FILES = ("train", "test", "meta")


def cifar100_files(folder: str | Path) -> list[Path]:
    """The pickles of a ``cifar-100-python`` folder; DataError if the layout is wrong."""
    folder = Path(folder)
    missing = [name for name in CIFAR100_FILES if not (folder / name).is_file()]
    if not folder.is_dir() or missing:
        found = sorted(p.name for p in folder.iterdir())[:10] if folder.is_dir() else []
        what = f"missing {missing}; found {found}" if folder.is_dir() else "no such folder"
        raise DataError(
            f"{folder}: not a cifar-100-python folder ({what}). Point data.path at the folder "
            "extracted from cifar-100-python.tar.gz, which holds the pickles 'train', 'test' and "
            "'meta'."
        )
    return [folder / name for name in CIFAR100_FILES]


def load_cifar100(folder: str | Path) -> Dataset:
    """Read a ``cifar-100-python`` folder in its original pickle layout."""
    folder = Path(folder)
    cifar100_files(folder)
    splits = {}
    for split in ("train", "test"):
        d = _unpickle(folder / split)
        for key in ("data", "fine_labels"):
            if key not in d:
                raise DataError(
                    f"{folder / split}: key '{key}' missing (found {sorted(d)}); this is not the "
                    "CIFAR-100 python pickle layout."
                )
        data = np.asarray(d["data"])
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            raise DataError(
                f"{folder / split}: 'data' must be uint8 (N, 3072) as R,G,B planes, got "
                f"{data.dtype} {data.shape}."
            )
        labels = np.asarray(d["fine_labels"], dtype=np.int64)
        if len(labels) != len(data):
            raise DataError(
                f"{folder / split}: {len(data)} images but {len(labels)} fine_labels; the file is "
                "truncated or mixed up. Re-extract it."
            )
        splits[split] = (data.reshape(-1, 3, 32, 32), labels)
    meta = _unpickle(folder / "meta")
    names = list(meta.get("fine_label_names", [str(c) for c in range(100)]))
    return Dataset(
        name="cifar100",
        source=str(folder),
        train_images=splits["train"][0],
        train_labels=splits["train"][1],
        test_images=splits["test"][0],
        test_labels=splits["test"][1],
        num_classes=100,
        scale=1.0 / 255.0,
        mean=CIFAR100_MEAN,
        std=CIFAR100_STD,
        class_names=names,
    )


def _to_nchw(x: np.ndarray, layout: str, path: Path, key: str) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    if x.ndim != 4:
        raise DataError(f"{path}: '{key}' must have 3 or 4 dimensions, got shape {x.shape}.")
    return np.transpose(x, (0, 3, 1, 2)) if layout == "nhwc" else x


def load_npz(path: str | Path, layout: str = "nchw", scale: float | None = None) -> Dataset:
    """A generic ``.npz`` with ``x_train``, ``y_train``, ``x_test``, ``y_test``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found. Set data.path to an existing .npz file.")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise DataError(f"{path}: not a readable .npz ({exc}).") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):  # a single .npy array loads as ndarray
        raise DataError(
            f"{path}: a single .npy array, not an .npz archive; save it with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)."
        )
    keys = ("x_train", "y_train", "x_test", "y_test")
    missing = [k for k in keys if k not in archive.files]
    if missing:
        raise DataError(
            f"{path}: missing arrays {missing} (found {archive.files}); save it with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)."
        )
    x_train = _to_nchw(archive["x_train"], layout, path, "x_train")
    x_test = _to_nchw(archive["x_test"], layout, path, "x_test")
    y_train, y_test = archive["y_train"].astype(np.int64), archive["y_test"].astype(np.int64)
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if len(x) != len(y):
            raise DataError(f"{path}: x_{split} has {len(x)} images but y_{split} {len(y)} labels.")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{path}: train images {x_train.shape[1:]} vs test {x_test.shape[1:]}.")
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    if scale is None:
        scale = 1.0 / 255.0 if x_train.dtype == np.uint8 else 1.0
    mean, std = channel_stats(x_train, scale)
    return Dataset(
        name=path.stem,
        source=str(path),
        train_images=x_train,
        train_labels=y_train,
        test_images=x_test,
        test_labels=y_test,
        num_classes=num_classes,
        scale=scale,
        mean=mean,
        std=std,
    )


def load_source(source: str, path: str | None = None, **options) -> Dataset:
    """Dispatch on the config's ``data.source``."""
    if source == "digits":
        return load_digits(options.get("test_fraction", 0.25), options.get("split_seed", 0))
    if path is None:
        raise DataError(f"data.source={source!r} needs data.path in the config.")
    if source == "cifar100":
        return load_cifar100(path)
    if source == "npz":
        return load_npz(path, options.get("layout", "nchw"), options.get("scale"))
    raise DataError(f"unknown data.source {source!r}; use digits, cifar100 or npz.")


def write_dataset(dataset: Dataset, path: str | Path) -> None:
    """Write ``dataset`` to ``path`` (dataset.h5), atomically."""
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for split, images, labels in (
            ("train", dataset.train_images, dataset.train_labels),
            ("test", dataset.test_images, dataset.test_labels),
        ):
            g = f.create_group(split)
            chunk = (min(len(images), 256), *images.shape[1:])
            g.create_dataset("images", data=images, chunks=chunk, compression="gzip")
            g.create_dataset("labels", data=labels)
        f["train"].create_dataset("holdout", data=dataset.holdout)
        f.attrs.update(
            name=dataset.name,
            source=dataset.source,
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
            )
            stored_hash = str(f.attrs["content_hash"])
    except (OSError, KeyError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc
    if ds.content_hash != stored_hash:
        raise DataError(f"{path}: content hash mismatch; the file is corrupt. Delete and rerun.")
    return ds
