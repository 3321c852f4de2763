"""Settings of the projected influence methods (``influence.projection`` of a run), without torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epochlens.errors import ConfigError

#: Methods scored from a store of projected gradients: logra (each layer's, both sides), trak (the whole).
PROJECTED_METHODS = ("logra", "trak")
STORE_DTYPES = ("float32", "float16")
PRECONDITIONERS = ("ekfac", "gauss_newton", "none")


@dataclass(frozen=True)
class ProjectionSettings:
    """How gradients are projected and stored (``influence.projection`` of a run).

    Attributes:
        dim: k of each side of a layer (k_out = min(dim, out), k_in = min(dim, in_dim)).
        dtype: of the stored gradients: float32, or float16 (half the disk; each row scaled by its
            largest magnitude first, so nothing overflows or underflows: ~3 significant digits).
        precondition: ekfac (EK-FAC in the projected space), gauss_newton (the projected
            Gauss-Newton matrix of each layer; trak's: of the whole) or none (dot products).
        seed: of the projections. trak_dim: k of trak's projection of the whole gradient, which
            ``whole`` (the method's, not a setting) selects.
    """

    dim: int = 32
    dtype: str = "float32"
    precondition: str = "gauss_newton"
    seed: int = 0
    trak_dim: int = 2048
    whole: bool = False

    def __post_init__(self) -> None:
        sizes = {"dim": self.dim, "trak_dim": self.trak_dim}
        bad = [n for n, v in sizes.items() if not (isinstance(v, int) and v >= 1)]
        problems = [f"{n}={sizes[n]!r} must be an integer >= 1" for n in bad]
        for name, allowed in (("dtype", STORE_DTYPES), ("precondition", PRECONDITIONERS)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name}={getattr(self, name)!r} must be one of {list(allowed)}")
        if problems:
            raise ConfigError("influence.projection: " + "; ".join(problems) + ". Fix the config.")

    def key(self) -> dict:  # as a job records them: its method's projection
        return {**self.store_key(), "precondition": self.precondition}

    def store_key(self) -> dict:
        """What the stored gradients depend on (not how the scores precondition them)."""
        key = {"dim": self.trak_dim if self.whole else self.dim, "dtype": self.dtype, "seed": self.seed}
        return {**key, "whole": True} if self.whole else key


def projection_settings(spec: Mapping | None, seed: int = 0, method: str | None = None) -> ProjectionSettings:
    """:class:`ProjectionSettings` from a run's ``influence.projection`` (the run's influence seed)."""
    spec = dict(spec or {})
    keys = ("dim", "dtype", "precondition", "trak_dim")
    return ProjectionSettings(**{k: spec[k] for k in keys if k in spec}, seed=seed, whole=method == "trak")
