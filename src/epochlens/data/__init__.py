"""Data sets: the supported sources and the ``dataset.h5`` contract (torch-free).

* :mod:`.dataset`  :class:`Dataset` (images, labels, holdout, normalisation) and ``dataset.h5``;
* :mod:`.sources`  digits, ``cifar-100-python`` folders and ``.npz`` files; :mod:`.stats` their statistics.
"""

from epochlens.data.dataset import Dataset, holdout_mask, read_dataset, write_dataset
from epochlens.data.sources import (
    CIFAR100_FILES,
    CIFAR100_MEAN,
    CIFAR100_STD,
    cifar100_files,
    load_cifar100,
    load_digits,
    load_npz,
    load_source,
)
from epochlens.data.stats import channel_stats

__all__ = [
    "CIFAR100_FILES",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "Dataset",
    "channel_stats",
    "cifar100_files",
    "holdout_mask",
    "load_cifar100",
    "load_digits",
    "load_npz",
    "load_source",
    "read_dataset",
    "write_dataset",
]
