"""A run's cached results, synthetic, for the explorer benchmark: what rule sample_dossier reads
(dataset.h5, corrupted_indices.npy, one index's sample_outputs.npz, per-checkpoint curvature
arrays, EK-FAC influence scores), at any size. Random numbers shaped like a 10-class run's (5%
corrupted, which lose more and are more self-influential), never shown as results: the benchmark
times building, loading and drawing them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from epochlens.data.dataset import Dataset, write_dataset
from epochlens.samples.dossier import DossierInputs, InfluenceScores

CLASSES = 10


def _dataset(rng: np.random.Generator, n: int, n_test: int) -> Dataset:
    return Dataset(
        name="synthetic",
        source="benchmarks/_synthetic_run.py",
        train_images=np.zeros((n, 1, 1, 1), np.uint8),
        train_labels=rng.integers(0, CLASSES, n),
        test_images=np.zeros((n_test, 1, 1, 1), np.uint8),
        test_labels=rng.integers(0, CLASSES, n_test),
        num_classes=CLASSES,
        scale=1.0,
        mean=(0.0,),
        std=(1.0,),
        holdout=rng.random(n) < 0.02,
    )


def _outputs(rng: np.random.Generator, n: int, epochs: np.ndarray, hard: np.ndarray, prefix: str) -> dict:
    m = len(epochs)
    logit = np.linspace(-1, 4, m)[:, None] - 2 * hard[None, :] + rng.normal(0, 0.5, (m, n))
    p = (1 / (1 + np.exp(-logit))).astype(np.float32)
    correct = p > 0.5
    return {
        f"{prefix}loss": -np.log(p),
        f"{prefix}p_label": p,
        f"{prefix}margin": (2 * p - 1).astype(np.float32),
        f"{prefix}correct": correct,
        f"{prefix}predicted": np.where(correct, 0, 1).astype(np.int64),
    }


def write_synthetic_run(
    root: str | Path, n: int, n_epochs: int, n_queries: int = 100, seed: int = 0
) -> DossierInputs:
    """Write the cached results of a run of ``n`` training samples analysed at ``n_epochs``
    checkpoints under ``root``; returns what sample_dossier builds the dossier from."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "data").mkdir(parents=True, exist_ok=True)
    data = _dataset(rng, n, max(n_queries, 100))
    write_dataset(data, root / "data/dataset.h5")
    corrupted = np.flatnonzero(rng.random(n) < 0.05)
    np.save(root / "data/corrupted_indices.npy", corrupted)
    hard = rng.random(n)
    hard[corrupted] += 2
    epochs = np.arange(n_epochs, dtype=np.int64) * 200
    outputs = {"epochs": epochs, **_outputs(rng, n, epochs, hard, "train_")}
    outputs.update(_outputs(rng, len(data.test_labels), epochs, rng.random(len(data.test_labels)), "test_"))
    np.savez(root / "sample_outputs.npz", **outputs)
    curvature = {}
    for e in epochs:
        folder = root / f"curvature/epoch_{e:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "per_image_curvature.npy", rng.gamma(2, 1 + hard, n).astype(np.float32))
        np.save(folder / "per_image_grad_norm.npy", rng.gamma(2, 1, n).astype(np.float32))
        curvature[(0, int(e))] = folder
    pairwise = rng.normal(0, 1, (n_queries, n)).astype(np.float32)
    pairwise[:, corrupted] += 3 * (rng.random((n_queries, 1)) < 0.2)
    scores = root / "influence/ekfac/scores.npz"
    scores.parent.mkdir(parents=True, exist_ok=True)
    self_influence = rng.gamma(1, 1, n) + 3 * np.isin(np.arange(n), corrupted)
    queries = np.arange(n_queries)
    np.savez(
        scores,
        self_influence=self_influence,
        pairwise_none=pairwise,
        query_sign=1.0,
        query_test_indices=queries,
    )
    return DossierInputs(
        run=f"synthetic-{n}",
        task="classification",
        dataset=root / "data/dataset.h5",
        corrupted=root / "data/corrupted_indices.npy",
        epochs=[int(e) for e in epochs],
        outputs={0: root / "sample_outputs.npz"},
        curvature=curvature,
        influence=[InfluenceScores(0, int(epochs[-1]), "ekfac", scores, None)],
    )
