"""What the curvature estimator refuses, naming what to fix: arguments that do not describe the same
samples or do not fit the task (:func:`check_arguments`), NaN/Inf in the inputs
(:func:`check_finite_images`) and in the results (:func:`check_finite_results`), and a model whose
outputs do not fit the task (:func:`check_outputs`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from epochlens.curvature.settings import CurvatureSettings
from epochlens.errors import ConfigError, EpochlensError
from epochlens.outcome import shifts


def check_arguments(
    images: torch.Tensor,
    labels: np.ndarray,
    sample_indices: np.ndarray,
    active_classes: np.ndarray,
    settings: CurvatureSettings,
    tokens: Mapping[str, torch.Tensor] | None,
) -> tuple[bool, bool, bool]:
    """(regression, causal or text-to-text LM, text-to-text) from the labels' dtype and shape, with
    what does not fit refused (ValueError, ConfigError)."""
    n_samples = len(images)
    if images.ndim < 2 or len(labels) != n_samples or len(sample_indices) != n_samples:
        raise ValueError(
            f"images {tuple(images.shape)}, labels ({len(labels)},) and sample_indices "
            f"({len(sample_indices)},) must describe the same N samples"
        )
    regression = np.issubdtype(labels.dtype, np.floating)
    lm = labels.ndim == 2 and tokens is not None and not regression  # a causal LM's token labels
    if regression and settings.temperature != 1.0:
        raise ConfigError(
            f"curvature.temperature={settings.temperature}: the temperature divides a classifier's "
            "logits; a regression's squared error has none. Set curvature.temperature: 1."
        )
    if regression and labels.ndim not in (1, 2):
        raise ValueError(f"regression targets must be (N,) or (N, D), got {labels.shape}")
    if not regression and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            "labels must be class ids (N,), a causal LM's token labels (N, L) or float regression targets"
        )
    seq2seq = lm and not shifts(tokens)  # a text-to-text model: tokens carry its decoder labels
    aligned = tokens["labels"] if seq2seq else tokens["input_ids"] if lm else None
    if lm and labels.shape != tuple(torch.as_tensor(aligned).shape):
        what = "decoder labels of the tokens" if seq2seq else "input_ids"
        raise ValueError(f"token labels {labels.shape} must have the shape of the {what}")
    if not (lm or regression) and (labels.ndim != 1 or (labels < 0).any()):
        raise ValueError("labels must be a 1-D array of non-negative class ids")
    if active_classes.ndim != 1 or len(np.unique(active_classes)) != len(active_classes):
        raise ConfigError(f"active_classes must be distinct class ids, got {active_classes}")
    if len(active_classes) == 0:
        raise ConfigError("active_classes is empty: no class has been trained at this epoch")
    return regression, lm, seq2seq


def check_finite_images(images: torch.Tensor, rows: np.ndarray, sample_indices: np.ndarray) -> None:
    """Raise EpochlensError naming the (global) indices of active samples with NaN/Inf pixels."""
    if not images.is_floating_point():
        return
    bad, step = [], max(1, (16 << 20) // (4 * math.prod(images.shape[1:])))  # 16 MB at a time
    for lo in range(0, len(rows), step):
        chunk = rows[lo : lo + step]
        finite = torch.isfinite(images[torch.as_tensor(chunk)].flatten(1)).all(1).cpu().numpy()
        bad.extend(sample_indices[chunk[~finite]].tolist())
    if bad:
        raise EpochlensError(
            f"{len(bad)} input image(s) contain NaN or Inf, sample indices {_short(bad)}: the "
            "data set file is corrupt or its normalisation divides by zero. Rebuild dataset.h5."
        )


def check_finite_results(stats: np.ndarray, sample_indices: np.ndarray) -> None:
    """Never hand back NaN for an active sample: name the samples whose results are not finite."""
    finite = np.isfinite(stats[:, :4]).all(1)
    if not finite.all():
        raise EpochlensError(
            f"curvature results are NaN or Inf for sample indices "
            f"{_short(sample_indices[~finite].tolist())} although their inputs and the weights are "
            "finite: the loss or its gradient overflowed. Use a larger temperature or a float64 "
            "model (model.double())."
        )


def _short(items: list, n: int = 10) -> str:
    return str(list(items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")


def check_outputs(
    logits: object,
    active_classes: np.ndarray,
    tokens: Mapping[str, torch.Tensor] | None = None,
    lm: bool = False,
    regression_targets: np.ndarray | None = None,
) -> None:
    """Check on one sample's output (``logits``) that the model returns (batch, classes) logits
    covering the classes, a causal LM (``lm``) (batch, length, vocabulary) logits, or a regression
    (one sample's ``regression_targets``) as many values as the targets."""
    if regression_targets is not None:
        want = int(np.prod(np.shape(regression_targets)[1:]))
        got = int(np.prod(logits.shape[1:])) if isinstance(logits, torch.Tensor) else None
        if got != want:
            raise EpochlensError(
                f"a regression model must return {want} value(s) per sample, the targets' number, got "
                + (f"{tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__)
                + ": check model.output and the model's head"
            )
        return
    if lm:
        length = tokens["input_ids" if shifts(tokens) else "labels"].shape[1]
        if not isinstance(logits, torch.Tensor) or logits.shape[:2] != (1, length) or logits.ndim != 3:
            raise EpochlensError(
                f"a causal LM must return logits of shape (batch, {length}, vocabulary), got "
                + (f"{tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__)
            )
        return
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise EpochlensError(
            f"the model must return logits of shape (batch, classes), got {type(logits).__name__}"
            + (f" {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else "")
        )
    if active_classes.max() >= logits.shape[1] or active_classes.min() < 0:
        raise ConfigError(
            f"active classes {active_classes.min()}..{active_classes.max()} do not all exist: the "
            f"model has {logits.shape[1]} outputs. Check the class order and the data set's "
            "num_classes."
        )
