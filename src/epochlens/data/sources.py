"""The data sources a run can name (``data.source``), each loaded into a :class:`Dataset`.

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (no download), split into train/test
  with a seeded stratified split.
* ``cifar100``: a ``cifar-100-python`` folder in its original pickle layout (files ``train``,
  ``test``, ``meta``; ``data`` uint8 (N, 3072) as R, G, B planes; ``fine_labels``).
* ``npz``: a generic ``.npz`` with ``x_train``, ``y_train``, ``x_test``, ``y_test``; inputs as
  images (N, H, W), (N, C, H, W) or (N, H, W, C) with ``layout: nhwc``, or vectors (N, D). Integer
  ``y`` are class ids; float ``y``, (N,) or (N, D), are regression targets, kept in their dtype.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np

from epochlens.data import stats
from epochlens.data.dataset import Dataset, check_targets
from epochlens.data.stats import channel_stats
from epochlens.data.stored_npz import Member, StoredRows, each_block, nonfinite_rows, stored_members
from epochlens.errors import DataError

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


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
        if len(labels) and (labels.min() < 0 or labels.max() > 99):
            raise DataError(
                f"{folder / split}: fine_labels must be class ids 0..99, found {labels.min()}..."
                f"{labels.max()}; this is not CIFAR-100's fine labelling. Re-extract the archive."
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
    if x.ndim == 2:  # vectors (N, D)
        return x
    if x.ndim == 3:
        return each_block(x, lambda rows: rows[:, None])
    if x.ndim != 4:
        raise DataError(
            f"{path}: '{key}' must be vectors (N, D) or images (N, H, W) / (N, C, H, W), got shape {x.shape}."
        )
    return each_block(x, lambda rows: np.transpose(rows, (0, 3, 1, 2))) if layout == "nhwc" else x


NORMALIZE = ("auto", "per_channel", "none")


def normalisation(
    x_train: np.ndarray, scale: float, normalize: str, regression: bool
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of the inputs' normalisation: the training inputs' per-channel statistics
    (``per_channel``; ``auto`` for class-labelled data) or none, mean 0 and std 1 (``none``; ``auto``
    for regression data, whose model, your own, was trained on the inputs as you stored them)."""
    if normalize not in NORMALIZE:
        raise DataError(f"data.normalize: {normalize!r} is not one of {list(NORMALIZE)}.")
    if normalize == "none" or (normalize == "auto" and regression):
        return (0.0,), (1.0,)
    return channel_stats(x_train, scale)


def load_npz(
    path: str | Path,
    layout: str = "nchw",
    scale: float | None = None,
    normalize: str = "auto",
    ground_truth_column: str | None = None,
) -> Dataset:
    """A generic ``.npz`` with ``x_train``, ``y_train``, ``x_test``, ``y_test``: class ids (integer
    ``y``) or regression targets (float ``y``, kept as stored; see the module doc); with
    ``ground_truth_column``, the name of a (N_train,) boolean array in it: your poisoned samples."""
    path = Path(path)
    archive = _open_npz(path)
    keys = ("x_train", "y_train", "x_test", "y_test")
    stored = stored_members(path)  # a large array stored as is: read by rows, never whole
    x_train, y_train, x_test, y_test = (_array(archive, key, path, stored.get(key)) for key in keys)
    x_train = _to_nchw(x_train, layout, path, "x_train")
    x_test = _to_nchw(x_test, layout, path, "x_test")
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if len(x) != len(y):
            raise DataError(f"{path}: x_{split} has {len(x)} samples but y_{split} {len(y)} labels.")
        if not len(x):
            raise DataError(f"{path}: the {split} split is empty (x_{split} has no samples).")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{path}: train inputs {x_train.shape[1:]} vs test {x_test.shape[1:]}.")
    regression = np.issubdtype(y_train.dtype, np.floating) or np.issubdtype(y_test.dtype, np.floating)
    if regression:
        y_train, y_test = check_targets(y_train, y_test, str(path))
        num_classes = 0
    else:
        y_train, y_test = _class_ids(y_train, y_test, path)
        num_classes = int(max(y_train.max(), y_test.max())) + 1
    if scale is None:
        scale = 1.0 / 255.0 if x_train.dtype == np.uint8 else 1.0
    mean, std = normalisation(x_train, scale, normalize, regression)
    ground_truth = None
    if ground_truth_column is not None:
        ground_truth = _npz_ground_truth(archive, ground_truth_column, path, len(x_train))
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
        kind="regression" if regression else "classification",
        ground_truth=ground_truth,
    )


def _open_npz(path: Path) -> np.lib.npyio.NpzFile:
    """The archive at ``path`` with x_train, y_train, x_test and y_test, or DataError with the fix."""
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
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in archive.files]
    if missing:
        raise DataError(
            f"{path}: missing arrays {missing} (found {archive.files}); save it with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)."
        )
    return archive


def _npz_ground_truth(archive: np.lib.npyio.NpzFile, column: str, path: Path, n_train: int) -> np.ndarray:
    """Your poisoned samples' flags: the (N_train,) bool array ``column`` of the archive."""
    from epochlens.data.ground_truth import as_flags

    if column not in archive.files:
        raise DataError(
            f"{path}: no array {column!r} (data.ground_truth.column; found "
            f"{archive.files}); save your poisoned samples' flags with np.savez(..., "
            f"{column}=mask), a bool array of one entry per training sample."
        )
    ground_truth = as_flags(archive[column], column, str(path))
    if ground_truth.shape != (n_train,):
        raise DataError(
            f"{path}: {column} has shape {ground_truth.shape}, one flag per training "
            f"sample needs ({n_train},)."
        )
    return ground_truth


def _array(archive: np.lib.npyio.NpzFile, key: str, path: Path, stored: Member | None = None):
    """``archive[key]``, numeric and finite, or DataError naming the file, the array and the fix; an
    array of more than :data:`~epochlens.data.stats.WHOLE_VALUES` values ``stored`` as is: read by
    rows (:class:`StoredRows`)."""
    try:
        large = stored is not None and math.prod(stored[2]) > stats.WHOLE_VALUES and len(stored[2]) > 1
        x = StoredRows(path, stored) if large else archive[key]
    except ValueError as exc:  # an object array: pickled Python objects
        raise DataError(
            f"{path}: '{key}' holds Python objects ({exc}); store numbers, e.g. "
            f"np.savez(path, {key}=np.asarray(values, dtype=np.float32))."
        ) from None
    rows = nonfinite_rows(x) if np.issubdtype(x.dtype, np.floating) else []
    if len(rows):
        raise DataError(
            f"{path}: '{key}' holds NaN or Inf values in {len(rows)} sample(s) (positions "
            f"{rows[:5].tolist()}...); repair or remove them before analysing."
        )
    return x


def _class_ids(y_train: np.ndarray, y_test: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Integer labels of both splits as int64 class ids (N,), or DataError with the fix."""
    for split, y in (("train", y_train), ("test", y_test)):
        if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
            raise DataError(
                f"{path}: y_{split} is {y.dtype} {y.shape}; class labels are integers (N,), regression "
                "targets floats (N,) or (N, D)."
            )
        if len(y) and y.min() < 0:
            raise DataError(
                f"{path}: y_{split} has negative class ids (min {y.min()}); classes are 0, 1, ..."
            )
    return y_train.astype(np.int64), y_test.astype(np.int64)


def load_source(source: str, path: str | None = None, **options) -> Dataset:
    """Dispatch on the config's ``data.source``."""
    if source == "digits":
        return load_digits(options.get("test_fraction", 0.25), options.get("split_seed", 0))
    if path is None:
        raise DataError(f"data.source={source!r} needs data.path in the config.")
    if source == "cifar100":
        return load_cifar100(path)
    if source == "npz":
        return load_npz(
            path,
            options.get("layout", "nchw"),
            options.get("scale"),
            options.get("normalize", "auto"),
            options.get("ground_truth_column"),
        )
    raise DataError(
        f"unknown data.source {source!r}; use digits, cifar100 or npz here (imagefolder, save_to_disk "
        "and parquet: epochlens.formats.images.load_images)."
    )
