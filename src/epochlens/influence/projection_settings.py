"""Settings of the projected influence methods (:class:`ProjectionSettings`, ``influence.projection`` of
a run), without torch: the config reads them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from epochlens.errors import ConfigError

#: Methods that score from a store of projected training gradients.
PROJECTED_METHODS = ("logra",)
STORE_DTYPES = ("float32", "float16")
PRECONDITIONERS = ("ekfac", "gauss_newton", "none")


@dataclass(frozen=True)
class ProjectionSettings:
    """How gradients are projected and stored (``influence.projection`` of a run).

    Attributes:
        dim: k of each side of a layer (k_out = min(dim, out), k_in = min(dim, in_dim)).
        dtype: of the stored gradients: float32, or float16 (half the disk; each row scaled by its
            largest magnitude first, so nothing overflows or underflows: ~3 significant digits).
        precondition: ekfac (EK-FAC in the projected space: the eigenbasis of the projected Kronecker
            factors, eigenvalues refitted to the projected gradients), gauss_newton (the layer's whole
            projected Gauss-Newton matrix) or none (projected gradient dot products); damped and
            inverted as the factor methods' curvature.
        seed: of the projections.
    """

    dim: int = 32
    dtype: str = "float32"
    precondition: str = "gauss_newton"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.dim, int) and self.dim >= 1):
            problems.append(f"dim={self.dim!r} must be an integer >= 1")
        for name, allowed in (("dtype", STORE_DTYPES), ("precondition", PRECONDITIONERS)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name}={getattr(self, name)!r} must be one of {list(allowed)}")
        if problems:
            raise ConfigError("influence.projection: " + "; ".join(problems) + ". Fix the config.")

    def key(self) -> dict:
        return asdict(self)

    def store_key(self) -> dict:
        """What the stored gradients depend on (not how the scores precondition them)."""
        return {k: v for k, v in asdict(self).items() if k != "precondition"}


def projection_settings(spec: Mapping | None, seed: int = 0) -> ProjectionSettings:
    """:class:`ProjectionSettings` from a run's ``influence.projection`` (the run's influence seed)."""
    spec = dict(spec or {})
    return ProjectionSettings(
        **{k: spec[k] for k in ("dim", "dtype", "precondition") if k in spec}, seed=seed
    )
