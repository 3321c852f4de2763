"""Errors of the influence engine. Each message names the layer or sample and what to do."""

from __future__ import annotations

from epochlens.errors import EpochlensError


class InfluenceError(EpochlensError):
    """Base class of the influence engine's errors."""


class LayerSelectionError(InfluenceError):
    """No layer, or a layer that cannot be tracked (grouped convolution, shared module, ...)."""


class EigenError(InfluenceError):
    """A curvature factor that holds NaN/Inf, or that no eigensolver could decompose."""


class DampingError(InfluenceError):
    """Damping that is zero, underflows, or cannot make a layer's solve finite."""


class FactorCacheError(InfluenceError):
    """A factors file that is unreadable or was computed for other inputs or settings."""


class NoFiniteSamplesError(InfluenceError):
    """Every sample of a set had NaN/Inf gradients."""
