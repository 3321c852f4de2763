"""The ``{data}`` of a training command: a run's prepared data set as an ``.npz`` any script reads.

A user's training script (``checkpoints.source: command``) trains on exactly the data that the
pipeline analyses, ``data.corruption`` included, by reading this file with ``numpy.load``:

============  =====================================  ==================================================
array         shape, dtype                           what
============  =====================================  ==================================================
x_train       (N, C, H, W) or (N, ...) float32       the inputs as the model sees them (normalised as
                                                     every stage normalises them: ``data.images``)
y_train       (N,) int64 class ids, or the targets   the labels as stored in dataset.h5 (regression
              (N,) / (N, D) in their float dtype     targets are never cast)
x_test        (N_test, ...) float32                  likewise
y_test        (N_test, ...)
holdout       (N,) bool                              training samples held out (``holdout_per_class``):
                                                     validation, not to be trained on
train_groups  (N,) int64 (data with groups only)     each sample's data group; ``group_names`` (str)
test_groups   (N_test,) int64
============  =====================================  ==================================================
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from epochlens.atomic import write_atomic
from epochlens.data.dataset import read_dataset
from epochlens.errors import DataError


def export_npz(dataset_path: str | Path, out: str | Path) -> dict[str, tuple[int, ...]]:
    """Write the ``dataset.h5`` at ``dataset_path`` as the ``.npz`` described above, atomically;
    return {array: shape}."""
    from epochlens.data.text import is_text_dataset

    if is_text_dataset(dataset_path):
        raise DataError(
            f"{dataset_path}: a text data set; the {{data}} export of a training command holds "
            "arrays of inputs and labels, not yet tokenised text. Read your texts in the command "
            "itself and leave {data} out of checkpoints.command."
        )
    dataset = read_dataset(dataset_path)
    arrays: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        arrays[f"x_{split}"] = dataset.normalized(split).numpy()
        arrays[f"y_{split}"] = np.asarray(dataset.labels(split))
        groups = dataset.groups(split)
        if groups is not None:
            arrays[f"{split}_groups"] = np.asarray(groups, dtype=np.int64)
    arrays["holdout"] = np.asarray(dataset.holdout, dtype=bool)
    if dataset.train_groups is not None:
        arrays["group_names"] = np.asarray(dataset.group_names, dtype=str)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    write_atomic(out, write)
    return {name: tuple(a.shape) for name, a in arrays.items()}
