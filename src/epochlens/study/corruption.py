"""Corrupting a training set on purpose, to test whether influence finds the corrupted samples.

* :func:`flip_labels`: a seeded fraction of the training samples gets another *active* class's
  label (uniform among the other active classes), the images (or a text data set's tokens) unchanged.
* :func:`plant_trigger`: a seeded fraction of the training samples of the other active classes
  gets a fixed checkerboard patch in a corner and the target class's label (a backdoor, as in
  BadNets, Gu et al. 2017); :func:`apply_trigger` puts the same patch on queries.
  A text run's trigger is a phrase: :mod:`epochlens.study.text_trigger`.
* :func:`add_target_noise`: a regression's seeded fraction of the training samples gets Gaussian
  noise added to its targets (``noise_scale`` times each target value's standard deviation over the
  training samples), the inputs unchanged: mislabelled continuous data.

All return a new :class:`epochlens.data.dataset.Dataset` (the original is not modified; its content hash
differs) and the sorted int64 positions of the corrupted samples in the training split. Samples of
the validation holdout are never corrupted (they are not trained on). Selections are pure functions
of (seed, fraction, eligible samples), via ``numpy.random.default_rng(seed)``.

The query transforms of the study are in :mod:`epochlens.study.transforms` (the data preparation
imports this module: a change there must not rerun it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from epochlens.data import Dataset
from epochlens.errors import ConfigError

CORNERS = ("bottom_right", "bottom_left", "top_right", "top_left")


def _active(dataset: Dataset, active_classes: np.ndarray | None) -> np.ndarray:
    if active_classes is None:
        return np.arange(dataset.num_classes)
    active = np.asarray(active_classes, np.int64)
    if active.ndim != 1 or len(np.unique(active)) != len(active) or len(active) == 0:
        raise ConfigError(f"active_classes must be distinct class ids, got {active}")
    return active


def _pick(eligible: np.ndarray, fraction: float, rng: np.random.Generator, what: str) -> np.ndarray:
    if not (0.0 <= fraction <= 1.0):
        raise ConfigError(f"{what}: fraction={fraction} must be within [0, 1]")
    k = int(round(fraction * len(eligible)))
    if fraction > 0 and k == 0:
        raise ConfigError(
            f"{what}: fraction={fraction} of {len(eligible)} eligible samples rounds to none; raise it."
        )
    return np.sort(rng.choice(eligible, size=k, replace=False)).astype(np.int64)


def _with_train(dataset: Dataset, images: np.ndarray | None, labels: np.ndarray, note: str) -> Dataset:
    """A copy with new training labels (and images; None: the inputs stay, shared, not copied: a
    corruption of labels or targets alone holds the images once)."""
    return dataclasses.replace(
        dataset,
        **({} if images is None else {"train_images": images}),
        train_labels=labels,
        source=f"{dataset.source} + {note}",
        holdout=dataset.holdout.copy(),
        class_names=list(dataset.class_names),
    )


def flip_labels(
    dataset: Dataset,
    fraction: float,
    seed: int = 0,
    active_classes: np.ndarray | None = None,
) -> tuple[Dataset, np.ndarray]:
    """Give ``fraction`` of the eligible training samples the label of another active class.

    Args:
        dataset: the clean data set.
        fraction: share of eligible samples to flip (rounded to the nearest count).
        seed: selection and new labels are a pure function of it.
        active_classes: classes a sample may have and may be flipped to (default: all); samples of
            other classes and of the holdout are not eligible.

    Returns:
        (corrupted data set, sorted int64 positions of the flipped training samples).
    """
    active = _active(dataset, active_classes)
    if len(active) < 2:
        raise ConfigError(f"flip_labels needs at least two active classes, got {active.tolist()}")
    labels = dataset.train_labels
    eligible = np.flatnonzero(np.isin(labels, active) & ~dataset.holdout)
    rng = np.random.default_rng(seed)
    idx = _pick(eligible, fraction, rng, "flip_labels")
    position = {int(c): i for i, c in enumerate(active)}
    old = np.array([position[int(c)] for c in labels[idx]], dtype=np.int64)
    offset = rng.integers(1, len(active), size=len(idx))  # never 0: always another class
    new_labels = labels.copy()
    new_labels[idx] = active[(old + offset) % len(active)]
    note = f"label_flip(fraction={fraction}, seed={seed}, n={len(idx)})"
    return _with_train(dataset, None, new_labels, note), idx


def trigger_value(dataset: Dataset) -> float:
    """The bright pixel value of the patch in the images' stored units: the value that scales to 1."""
    high = 1.0 / dataset.scale
    if np.issubdtype(dataset.train_images.dtype, np.integer):
        high = min(round(high), np.iinfo(dataset.train_images.dtype).max)
    return float(high)


def apply_trigger(
    images: np.ndarray, patch_size: int = 3, corner: str = "bottom_right", high: float = 255.0
) -> np.ndarray:
    """A copy of ``images`` (N, C, H, W) with a checkerboard patch (high / 0) in a corner, all channels."""
    if corner not in CORNERS:
        raise ConfigError(f"corner={corner!r} must be one of {list(CORNERS)}")
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {images.shape}")
    h, w = images.shape[2:]
    if not (1 <= patch_size <= min(h, w)):
        raise ConfigError(f"patch_size={patch_size} must be within 1..{min(h, w)} for {h}x{w} images")
    out = images.copy()
    rows = slice(h - patch_size, h) if corner.startswith("bottom") else slice(0, patch_size)
    cols = slice(w - patch_size, w) if corner.endswith("right") else slice(0, patch_size)
    checker = (np.add.outer(np.arange(patch_size), np.arange(patch_size)) % 2 == 0).astype(np.float64)
    out[:, :, rows, cols] = (checker * high).astype(images.dtype)
    return out


def plant_trigger(
    dataset: Dataset,
    fraction: float,
    target_class: int,
    seed: int = 0,
    patch_size: int = 3,
    corner: str = "bottom_right",
    active_classes: np.ndarray | None = None,
) -> tuple[Dataset, np.ndarray]:
    """Stamp the trigger on ``fraction`` of the eligible training samples and relabel them as the target.

    Eligible: samples of active classes other than ``target_class``, outside the holdout. The patch
    value is :func:`trigger_value` (255 for CIFAR's uint8, 16 for digits).

    Returns:
        (corrupted data set, sorted int64 positions of the poisoned training samples).
    """
    active = _active(dataset, active_classes)
    if target_class not in active:
        raise ConfigError(f"target_class={target_class} is not an active class ({active.tolist()})")
    labels = dataset.train_labels
    eligible = np.flatnonzero(np.isin(labels, active) & (labels != target_class) & ~dataset.holdout)
    idx = _pick(eligible, fraction, np.random.default_rng(seed), "plant_trigger")
    images = np.array(dataset.train_images)  # a copy (of images spilled to disk: read whole)
    images[idx] = apply_trigger(images[idx], patch_size, corner, trigger_value(dataset))
    new_labels = labels.copy()
    new_labels[idx] = target_class
    note = (
        f"trigger(fraction={fraction}, target={target_class}, patch={patch_size}, corner={corner}, "
        f"seed={seed}, n={len(idx)})"
    )
    return _with_train(dataset, images, new_labels, note), idx


def add_target_noise(
    dataset: Dataset, fraction: float, noise_scale: float = 3.0, seed: int = 0
) -> tuple[Dataset, np.ndarray]:
    """Add N(0, (noise_scale · σ_j)²) to value j of the targets of ``fraction`` of the training
    samples outside the holdout, σ_j the standard deviation of value j over the training samples
    (regression data; the targets keep their dtype).

    Returns:
        (corrupted data set, sorted int64 positions of the noised training samples).
    """
    if dataset.kind != "regression":
        raise ConfigError(
            "data.corruption.kind=target_noise adds noise to regression targets; this data set has class "
            "labels (use label_flip)."
        )
    if not noise_scale > 0:
        raise ConfigError(f"target_noise: noise_scale={noise_scale} must be > 0")
    targets = dataset.train_labels
    rng = np.random.default_rng(seed)
    idx = _pick(np.flatnonzero(~dataset.holdout), fraction, rng, "target_noise")
    flat = targets.reshape(len(targets), -1).astype(np.float64)
    sigma = flat.std(axis=0)
    sigma[sigma == 0] = 1.0
    noisy = flat.copy()
    noisy[idx] += rng.standard_normal((len(idx), flat.shape[1])) * noise_scale * sigma
    new_targets = noisy.reshape(targets.shape).astype(targets.dtype)
    note = f"target_noise(fraction={fraction}, noise_scale={noise_scale}, seed={seed}, n={len(idx)})"
    return _with_train(dataset, None, new_targets, note), idx


def corrupt(dataset: Dataset, spec: dict | None) -> tuple[Dataset, np.ndarray]:
    """Apply the config's ``data.corruption`` (kind none, label_flip, trigger or target_noise).

    Returns:
        The (possibly) corrupted data set and the sorted int64 positions of the corrupted training
        samples (empty for kind none).
    """
    spec = spec or {"kind": "none"}
    kind = spec["kind"]
    if kind == "label_flip":
        if getattr(dataset, "kind", "classification") == "regression":
            raise ConfigError(
                "data.corruption.kind=label_flip gives samples another class; a regression's "
                "targets take target_noise."
            )
        return flip_labels(dataset, spec["fraction"], spec["seed"])
    if kind == "target_noise":
        return add_target_noise(dataset, spec["fraction"], spec.get("noise_scale", 3.0), spec["seed"])
    if kind == "trigger":
        if not hasattr(dataset, "train_images"):
            raise ConfigError(
                "data.corruption.kind=trigger stamps a patch on images here; a text data set's trigger "
                "phrase is planted by epochlens.study.text_trigger.corrupt_text."
            )
        return plant_trigger(
            dataset, spec["fraction"], spec["target_class"], spec["seed"], spec["patch_size"], spec["corner"]
        )
    if kind != "none":
        raise ConfigError(f"data.corruption.kind={kind!r} must be none, label_flip, trigger or target_noise.")
    return dataset, np.zeros(0, dtype=np.int64)
