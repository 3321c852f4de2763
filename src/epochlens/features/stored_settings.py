"""Settings of features built from stored activations (torch-free: the workflow reads them while
planning).

A run with ``checkpoints.source: activations`` has no model: each "checkpoint" is a folder of the
user's stored activations (``checkpoints.path`` with ``{epoch}``, one folder per snapshot), read by
:mod:`epochlens.features.stored`. Its representations are built-ins (:data:`STORED_BUILTINS`) or
the user's functions, named by import path ``package.module:function`` (a batch of one layer's
activations (B, *shape) in, (B, dims) out); a user function's source files are part of the cache
key, so editing one rebuilds the features.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from epochlens.errors import ConfigError, FeatureError
from epochlens.features.settings import SPLITS, RepresentationSettings

#: Bump when the meaning of features from stored activations changes: old caches rebuild.
STORED_FORMAT_VERSION = 1
#: File formats of a snapshot folder (module doc of :mod:`epochlens.features.stored`).
STORED_FORMATS = ("auto", "save_to_disk", "parquet", "npy", "safetensors")
#: Built-in representations of a stored activation (B, *shape) -> (B, d), each one line
#: (:mod:`epochlens.features.stored_representations`).
STORED_BUILTINS = {
    "pooled": "mean over the positions after the channels: (B, C, *positions) -> (B, C)",
    "stats": "mean, std, min, max, rms and share positive of the whole activation -> (B, 6)",
    "spectral": "top-k singular values of the (C, positions) or (tokens, D) matrix -> (B, k)",
    "mean": "mean over the tokens: (B, T, D) -> (B, D)",
    "max": "maximum over the tokens: (B, T, D) -> (B, D)",
    "first": "the first token (a CLS token): (B, T, D) -> (B, D)",
    "last": "the last token: (B, T, D) -> (B, D)",
    "norms": "Euclidean norm of each token: (B, T, D) -> (B, T)",
    "flat": "the whole activation, flattened: (B, *shape) -> (B, prod(shape))",
}
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def detect_format(folder: Path) -> str:
    """``save_to_disk``, ``parquet``, ``npy`` or ``safetensors`` from a snapshot's files (torch-free:
    the workflow asks it while planning whether a snapshot is decoded once, :func:`decoded_once`)."""
    if (folder / "dataset_dict.json").exists():
        return "save_to_disk"
    for fmt, pattern in (("parquet", "*.parquet"), ("npy", "*.npy"), ("safetensors", "*.safetensors")):
        if next(folder.rglob(pattern), None) is not None:
            return fmt
    raise FeatureError(
        f"{folder}: no stored activations found (a save_to_disk DatasetDict folder, train.parquet, "
        "or train/<layer>.npy or .safetensors). Point checkpoints.path at the snapshot folders."
    )


def decoded_once(folder: str | Path, file_format: str) -> bool:
    """Whether the snapshot ``folder`` (``checkpoints.format`` ``file_format``) is parquet, which
    the workflow decodes once into ``.npy`` layers (:mod:`epochlens.features.stored_decode`) for
    all its representations to read: Arrow decodes parquet at about 0.01x a plain read of the
    files, each representation job would pay it again. A folder not there yet: not decoded (its
    features job names it)."""
    if file_format != "auto":
        return file_format == "parquet"
    folder = Path(folder)
    try:
        return folder.is_dir() and detect_format(folder) == "parquet"
    except FeatureError:
        return False


def is_user_representation(name: str) -> bool:
    """Whether ``name`` is an import path ``package.module:function`` (else a built-in)."""
    return bool(_IMPORT_PATH.match(name))


@dataclass
class StoredFeatureSettings:
    """Which stored activations become features, and how."""

    layers: list[str] | None = field(
        default=None,
        metadata={"help": "layer names (columns or file stems); None: every layer of the snapshot"},
    )
    representations: tuple[str, ...] = field(
        default=("mean",),
        metadata={"help": f"built-ins {list(STORED_BUILTINS)} or 'package.module:function'"},
    )
    file_format: str = field(default="auto", metadata={"help": f"one of {list(STORED_FORMATS)}"})
    id_column: str | None = field(
        default=None,
        metadata={
            "help": "column (Arrow formats) or file stem (npy, safetensors) holding each row's "
            "position in the run's split; None: rows are in the split's order"
        },
    )
    project_path: str | None = field(
        default=None, metadata={"help": "folder put on sys.path for user representations"}
    )
    spectral_k: int = field(default=8, metadata={"help": "singular values kept (spectral)"})
    spectral_method: str = field(default="auto", metadata={"help": "as features.spectral_method"})
    dtype: str = field(default="float32", metadata={"help": "storage dtype of the features"})
    splits: tuple[str, ...] = field(default=SPLITS, metadata={"help": "data splits"})
    user_code: Mapping[str, str] = field(
        default_factory=dict,
        metadata={"help": "fingerprint of each user representation's source files (cache key)"},
    )
    batch_size: int = field(
        default=1024, metadata={"help": "rows per representation call", "execution": True}
    )

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            self.layers = [self.layers]
        self.layers = None if self.layers is None else list(self.layers)
        self.representations, self.splits = tuple(self.representations), tuple(self.splits)
        self.user_code = dict(self.user_code)
        problems = []
        bad = [r for r in self.representations if r not in STORED_BUILTINS and not is_user_representation(r)]
        if bad:
            problems.append(
                f"representations {bad} are neither built-ins {list(STORED_BUILTINS)} nor import "
                "paths 'package.module:function'"
            )
        if not self.representations or len(set(self.representations)) != len(self.representations):
            problems.append(f"representations {list(self.representations)} must be distinct, not empty")
        if self.layers is not None and (not self.layers or len(set(self.layers)) != len(self.layers)):
            problems.append(f"layers {self.layers} must be distinct names (null: every layer)")
        if self.file_format not in STORED_FORMATS:
            problems.append(f"format={self.file_format!r} must be one of {list(STORED_FORMATS)}")
        if self.dtype not in ("float32", "float16"):
            problems.append(f"dtype={self.dtype!r} must be float32 or float16")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if problems:
            raise ConfigError("stored activations: " + "; ".join(problems) + ". Fix the config.")
        self.spectral_settings()  # checks spectral_k and spectral_method

    def spectral_settings(self) -> RepresentationSettings:
        """The image features' spectral settings, used by the ``spectral`` built-in."""
        return RepresentationSettings(
            names=("spectral",), spectral_k=self.spectral_k, spectral_method=self.spectral_method
        )

    def representation_spec(self, name: str) -> dict:
        """What one representation's values depend on (besides the activations)."""
        if is_user_representation(name):
            return {"function": name, "code": self.user_code.get(name)}
        if name == "spectral":
            return {"builtin": name, "k": self.spectral_k, "method": self.spectral_method}
        return {"builtin": name}

    def spec(self) -> dict:
        """The cache key's spec: layers, each representation's spec, alignment, dtype, splits."""
        return {
            "format_version": STORED_FORMAT_VERSION,
            "kind": "stored",
            "layers": "all" if self.layers is None else list(self.layers),
            "representations": {r: self.representation_spec(r) for r in self.representations},
            "id_column": self.id_column,
            "dtype": self.dtype,
            "splits": list(self.splits),
        }
