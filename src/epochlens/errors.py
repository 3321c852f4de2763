"""Errors a user can fix. Every message names the file involved and what to do about it."""

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
