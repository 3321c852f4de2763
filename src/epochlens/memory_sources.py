"""The sizes jobs' memory grows with, read from their inputs (:mod:`epochlens.memory`; torch-free,
imported by no job): what ``prepare_data`` holds of its data source, a source file whole but for
the ``.npz`` arrays it reads by rows (:func:`held_bytes`), a data folder (a param of the rule, not
its input) by its files, an image folder's images decoded up to what it keeps in memory
(:func:`data_folder_bytes`); a checkpoint's weights (:func:`model_bytes`), a dossier's rows, a
dataset.h5's samples (:func:`stored_sizes`)."""

from __future__ import annotations

import functools
import math
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from epochlens.formats.folder_listing import FOLDER_SOURCES, folder_files

#: Files of a Hugging Face checkpoint folder that hold the model (not the optimizer's state).
MODEL_FILES = ("model*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")


def size(path: str) -> int:
    """The bytes of a file, or of every file under a folder (0: not there yet)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def held_bytes(path: str) -> int:
    """The bytes of a data source file that ``prepare_data`` holds: an ``.npz``'s arrays but those
    it reads by rows (stored as is, above ``WHOLE_VALUES`` values: epochlens.data.stored_npz), any
    other file whole."""
    from epochlens.data.stats import WHOLE_VALUES
    from epochlens.data.stored_npz import stored_members

    if not path.endswith(".npz") or not Path(path).is_file():
        return size(path)
    try:
        members = stored_members(path).values()
    except (OSError, zipfile.BadZipFile):  # damaged: the job's own read says so
        return size(path)
    by_rows = [
        (dtype, shape) for _, dtype, shape in members if len(shape) > 1 and math.prod(shape) > WHOLE_VALUES
    ]
    return max(0, size(path) - sum(dtype.itemsize * math.prod(shape) for dtype, shape in by_rows))


def data_folder_bytes(data: Mapping[str, Any]) -> int:
    """What ``prepare_data`` holds of a run's data folder (a ``data`` config section): an image
    folder's images decoded (files x channels x height x width, the size ``images.size`` asks for
    or else the first image's) up to what it keeps in memory (a split above ``WHOLE_VALUES`` values
    goes to disk: epochlens.data.blocks), another folder's files whole; 0 for a source that is not
    a folder (its files are the job's inputs) or a folder not there yet."""
    from epochlens.data.stats import WHOLE_VALUES

    path = data.get("path")
    if data.get("source") not in FOLDER_SOURCES or not path or not Path(path).is_dir():
        return 0
    files, total, first = _folder_files(str(path), Path(path).stat().st_mtime_ns)
    if data["source"] != "imagefolder" or first is None:
        return total
    images = data.get("images") or {}
    decoded = files * (1 if images.get("channels") == "L" else 3) * _pixels(images.get("size"), first)
    return min(decoded, 2 * WHOLE_VALUES)  # uint8: a value a byte, train and test


@functools.lru_cache(maxsize=16)
def _folder_files(folder: str, mtime_ns: int) -> tuple[int, int, str | None]:
    """The files under ``folder`` (hidden ones left out), their bytes and the first one's path."""
    count, total, first = 0, 0, None
    for rel, nbytes, _ in folder_files(folder):
        count, total, first = count + 1, total + nbytes, first or os.path.join(folder, rel)
    return count, total, first


def _pixels(size: Any, first: str) -> int:
    """Height x width of the images: ``size`` (an int or [height, width]), else the first image's
    (read from its header, not decoded); 0 if it is not an image."""
    if size:
        return size * size if isinstance(size, int) else math.prod(size)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(first) as image:
            return image.width * image.height
    except (OSError, UnidentifiedImageError):
        return 0


def dossier_rows(path: str | Path) -> int:
    """The rows of a ``dossier.parquet`` (from its footer), 0 while it does not exist yet: the
    samples of a job that reads the dossier instead of the data set (the explorer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows if Path(path).is_file() else 0
    except (OSError, pa.ArrowException):  # damaged: the explorer's own read says so
        return 0


def model_bytes(path: str | Path) -> int:
    """The bytes of a checkpoint's weights: the file, or a checkpoint folder's model files."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        files = {p for pattern in MODEL_FILES for p in path.glob(pattern)}
        return sum(p.stat().st_size for p in files if "optimizer" not in p.name)
    return 0


@functools.lru_cache(maxsize=64)
def stored_sizes(path: str, mtime_ns: int, size: int) -> tuple[int, int, bool]:
    """(samples, bytes a sample, text) of a ``dataset.h5`` as it is: its train and test images or
    token ids (``mtime_ns`` and ``size`` key the cache; :func:`epochlens.memory.dataset_shape`)."""
    import h5py

    samples, sample_bytes, text = 0, 0, False
    with h5py.File(path, "r") as f:
        for split in ("train", "test"):
            group = f.get(split)
            key = next((k for k in ("images", "input_ids") if group is not None and k in group), None)
            if key is None:
                continue
            rows = group[key]
            samples += rows.shape[0]
            sample_bytes = max(sample_bytes, math.prod(rows.shape[1:]) * rows.dtype.itemsize)
            text = key == "input_ids"
    return samples, sample_bytes, text
