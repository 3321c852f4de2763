"""Errors a user can fix, all in one place. Every message names the file, config key, layer or
sample involved and what to do about it.

Every class derives from :class:`EpochlensError`: the workflow's steps report it as its message
alone, without a traceback (:func:`epochlens.runner.run_step`).
"""

from __future__ import annotations


class EpochlensError(RuntimeError):
    """Base class: bad input or configuration, reported with the file and the fix."""


class DataError(EpochlensError):
    """A data set that is missing, corrupt or in an unexpected layout."""


class CheckpointError(EpochlensError):
    """A checkpoint that is missing, unreadable or does not fit the model."""


class ClassOrderError(EpochlensError):
    """A class order that is not a permutation of the data set's classes."""


class ConfigError(EpochlensError):
    """A configuration value that cannot work."""


class LayerError(EpochlensError):
    """A layer spec naming modules the model does not have, or modules unfit for hooking."""


class FeatureError(EpochlensError):
    """A feature file that is unreadable or incomplete, or features that cannot be stored."""


class ProbeError(EpochlensError):
    """Probe inputs that cannot work (too few samples, mismatched lengths)."""


# Influence engine


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
