"""Which columns of a snapshot of stored activations are layers (torch-free: the workflow asks it
while planning, so that a bad ``features.layers`` fails the dry run, not a job).

A ``save_to_disk`` or parquet snapshot often keeps other columns beside its layers (``label``,
``text``, a file name): a layer holds a list per row (``Sequence``, ``Array2D``/``Array3D``),
those hold one scalar or string per row; likewise a ``.npy`` or ``.safetensors`` file of shape
(N,) beside the layer files (N, *shape), read from its header. They are left out of the layers
(the features job names them in its log), as is ``checkpoints.id_column``. ``features.layers``
lists names or fnmatch patterns (``layer_*``, ``encoder.*.out``), as ``influence.layers`` does.
"""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

from epochlens.errors import FeatureError

#: The characters that make a ``features.layers`` entry an fnmatch pattern.
PATTERN_CHARS = "*?["


def is_activation_type(arrow_type) -> bool:
    """Whether an Arrow column type holds activations: a list per row (an extension type such as
    datasets' ``Array3D`` by its storage), not a number or a string."""
    import pyarrow as pa

    if isinstance(arrow_type, pa.ExtensionType):
        arrow_type = arrow_type.storage_type
    kinds = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    return any(kind(arrow_type) for kind in kinds)


def split_columns(schema, id_column: str | None) -> tuple[list[str], list[str]]:
    """(layers, other columns) of an Arrow ``schema``; the id column is neither."""
    layers, others = [], []
    for name, arrow_type in zip(schema.names, schema.types, strict=True):
        if name != id_column:
            (layers if is_activation_type(arrow_type) else others).append(name)
    return layers, others


def file_columns(folder: str | Path, file_format: str, id_column: str | None) -> tuple[list[str], list[str]]:
    """(layers, other files) of one split's folder of ``.npy`` or ``.safetensors`` files, by stem
    in natural order (``layer_2`` before ``layer_10``); a file of one value per row (N,) is not a
    layer, nor is the id column's."""
    paths = sorted(Path(folder).glob(f"*.{file_format}"), key=lambda p: _natural(p.stem))
    layers, others = [], []
    for path in paths:
        if path.stem != id_column:
            (others if _rank(path, file_format) == 1 else layers).append(path.stem)
    return layers, others


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _rank(path: Path, file_format: str) -> int | None:
    """The number of dimensions in a file's header (None: unreadable; the reader says why)."""
    try:
        with open(path, "rb") as f:
            if file_format == "npy":
                version = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                return len(read(f)[0])
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            tensors = [v for k, v in header.items() if k != "__metadata__"]
            return len(tensors[0]["shape"]) if len(tensors) == 1 else None
    except (OSError, ValueError, KeyError, IndexError, AttributeError):
        return None


def arrow_schema(folder: str | Path, file_format: str, split: str = "train"):
    """The Arrow schema of ``split`` of a ``save_to_disk`` or parquet snapshot, read from its
    first file's metadata (no values read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    if file_format == "parquet":
        single = folder / f"{split}.parquet"
        files = [single] if single.exists() else sorted((folder / split).glob("*.parquet"))
        if not files:
            raise FeatureError(f"{folder}: no {split}.parquet or {split}/*.parquet.")
        return pq.read_schema(files[0])
    state = folder / split / "state.json"
    try:
        first = folder / split / json.loads(state.read_text())["_data_files"][0]["filename"]
        with pa.memory_map(str(first)) as source:
            return pa.ipc.open_stream(source).schema
    except (OSError, KeyError, IndexError, ValueError) as exc:
        raise FeatureError(
            f"{state.parent}: not a save_to_disk split ({type(exc).__name__}: {exc}); write it with "
            "DatasetDict.save_to_disk."
        ) from exc


def resolve_layers(stored: list[str], asked: list[str] | None, others: list[str], where: str) -> list[str]:
    """The layers ``asked`` for (names or fnmatch patterns; None: every stored layer), in the order
    asked (a pattern's matches in the snapshot's order); a name that is not stored, a pattern that
    matches nothing or a column that is not activations is an error naming ``where``."""
    if asked is None:
        if not stored:
            raise FeatureError(f"{where}: the snapshot holds no layers (columns of activations).")
        return list(stored)
    not_layers = [name for name in asked if name in others]
    if not_layers:
        raise FeatureError(
            f"{where}: {not_layers} hold one value per row, not activations; leave them out of "
            f"features.layers (the layers: {stored[:40]})."
        )
    chosen: list[str] = []
    for entry in asked:
        pattern = any(c in entry for c in PATTERN_CHARS)
        chosen += [
            n for n in stored if (fnmatchcase(n, entry) if pattern else n == entry) and n not in chosen
        ]
    missing = [e for e in asked if not any(fnmatchcase(n, e) for n in chosen)]
    if missing:
        raise FeatureError(
            f"{where}: no layer(s) {missing} (no stored layer has that name or matches that pattern); "
            f"the snapshot has {stored[:40]}. Fix features.layers (names, or patterns such as "
            "'layer_*'; null: every stored layer) or store them."
        )
    return chosen
