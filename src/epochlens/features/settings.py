"""Settings of feature extraction and of the representations (torch-free: the workflow reads them
while planning).

Fields whose metadata says ``execution`` do not change the stored values (batch size, compression):
they are not part of the cache key, and the workflow leaves them out of the rules' params.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from epochlens.errors import ConfigError
from epochlens.resources import PRECISIONS

#: Bump when the meaning of stored values changes (e.g. the default layers): old caches rebuild.
FORMAT_VERSION = 1
SPLITS = ("train", "test")
REPRESENTATIONS = ("pooled", "stats", "spectral")
SPECTRAL_METHODS = ("auto", "gram", "exact", "randomized")


@dataclass
class RepresentationSettings:
    """Which representations are built from each layer's activation, and how."""

    names: tuple[str, ...] = field(
        default=REPRESENTATIONS,
        metadata={"help": f"representations to compute, any of {list(REPRESENTATIONS)}"},
    )
    spectral_k: int = field(default=8, metadata={"help": "number of top singular values (spectral)"})
    spectral_method: Literal["auto", "gram", "exact", "randomized"] = field(
        default="auto",
        metadata={
            "help": "gram (float64 Gram eigenvalues), exact (svdvals), randomized (range finder), "
            "or auto: gram where min(C, H*W) <= 128, else randomized"
        },
    )
    spectral_oversample: int = field(
        default=16, metadata={"help": "extra columns of the randomized sketch (q = k + oversample)"}
    )
    spectral_iters: int = field(default=2, metadata={"help": "power iterations of the randomized SVD"})
    spectral_seed: int = field(default=0, metadata={"help": "seed of the randomized SVD's test matrix"})

    def __post_init__(self) -> None:
        self.names = tuple(self.names)
        problems = []
        unknown = [n for n in self.names if n not in REPRESENTATIONS]
        if unknown:
            problems.append(f"unknown representations {unknown} (choose from {list(REPRESENTATIONS)})")
        if not self.names:
            problems.append("names is empty: ask for at least one representation")
        if len(set(self.names)) != len(self.names):
            problems.append(f"names {list(self.names)} repeats a representation")
        if self.spectral_k < 1:
            problems.append(f"spectral_k={self.spectral_k} must be >= 1")
        if self.spectral_method not in SPECTRAL_METHODS:
            problems.append(
                f"spectral_method={self.spectral_method!r} must be one of {list(SPECTRAL_METHODS)}"
            )
        if self.spectral_oversample < 0 or self.spectral_iters < 0:
            problems.append("spectral_oversample and spectral_iters must be >= 0")
        if problems:
            raise ConfigError("representation settings: " + "; ".join(problems) + ". Fix the config.")

    def spec(self) -> dict:
        """What the values depend on (for cache keys): spectral fields only when spectral is asked for."""
        d = asdict(self)
        d["names"] = list(self.names)
        if "spectral" not in self.names:
            d = {"names": d["names"]}
        return d


@dataclass
class FeatureSettings:
    """What is extracted from each checkpoint and how it is stored."""

    layers: list[str] | None = field(
        default=None,
        metadata={
            "help": "module names to hook (as in model.named_modules()); None: every block output "
            "(SmallCNN: block1-3; ResNet18LoP: layer1.0 ... layer4.1)"
        },
    )
    representations: RepresentationSettings = field(
        default_factory=RepresentationSettings,
        metadata={"help": "pooled / stats / spectral and the spectral settings"},
    )
    dtype: Literal["float32", "float16"] = field(
        default="float32", metadata={"help": "storage dtype of the features (computed in float32)"}
    )
    precision: Literal["float32", "bfloat16", "float16"] = field(
        default="float32",
        metadata={
            "help": "forward pass in float32, or autocast to bfloat16 / float16 where the device has "
            "it; the representations are computed and stored in float32 either way"
        },
    )
    splits: tuple[str, ...] = field(default=SPLITS, metadata={"help": "data splits to extract"})
    batch_size: int = field(
        default=256,
        metadata={"help": "images per forward pass; bounds activation memory", "execution": True},
    )
    compression: Literal["gzip", "lzf", "none"] = field(
        default="gzip",
        metadata={"help": "HDF5 filter (gzip is readable by every HDF5 tool)", "execution": True},
    )
    compression_level: int = field(default=4, metadata={"help": "gzip level 1-9", "execution": True})

    def __post_init__(self) -> None:
        if isinstance(self.representations, Mapping):
            self.representations = RepresentationSettings(**self.representations)
        problems = self._layer_problems()
        self.splits = tuple(self.splits)
        if self.dtype not in ("float32", "float16"):
            problems.append(f"dtype={self.dtype!r} must be float32 or float16")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} must be one of {list(PRECISIONS)}")
        bad_splits = [s for s in self.splits if s not in SPLITS]
        if bad_splits or not self.splits or len(set(self.splits)) != len(self.splits):
            problems.append(f"splits={list(self.splits)} must be distinct values of {list(SPLITS)}")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if self.compression not in ("gzip", "lzf", "none"):
            problems.append(f"compression={self.compression!r} must be gzip, lzf or none")
        if not 1 <= self.compression_level <= 9:
            problems.append(f"compression_level={self.compression_level} must be 1..9")
        if problems:
            raise ConfigError("feature settings: " + "; ".join(problems) + ". Fix the config.")

    def _layer_problems(self) -> list[str]:
        """``layers`` as a list (None: the default block outputs): what is wrong with it."""
        if isinstance(self.layers, str):
            self.layers = [self.layers]
        if self.layers is None:
            return []
        self.layers = list(self.layers)
        problems = []
        if not self.layers:
            problems.append("layers is an empty list (use null for the default block outputs)")
        if len(set(self.layers)) != len(self.layers):
            problems.append(f"layers {self.layers} names a module twice")
        return problems

    def spec(self) -> dict:
        """What the stored values depend on besides checkpoint and data (part of the cache key).

        ``precision`` only when it is not float32, so that the keys of float32 files written before
        the setting existed stay what they were."""
        spec = {
            "format_version": FORMAT_VERSION,
            "layers": "default_blocks" if self.layers is None else list(self.layers),
            "representations": self.representations.spec(),
            "dtype": self.dtype,
            "splits": list(self.splits),
        }
        if self.precision != "float32":
            spec["precision"] = self.precision
        return spec
