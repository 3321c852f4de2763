"""Shared fixtures: small, seeded and fast (two CPU cores).

Layout: ``unit/<area>/`` mirrors the library's packages (maths against exact answers, no
Snakemake), ``workflow/`` drives Snakemake on tiny runs (one factory: :func:`wfutil.tiny_run`),
``cluster/`` runs the workflow on a local SLURM cluster. ``wfutil`` (next to this file) is shared
by the workflow and cluster tests; ``userproject`` builds a user's own project (a ViT-like model
trained outside epochlens, its checkpoints and image data in the formats users bring).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # wfutil, for tests in any subfolder

from quality import SEED  # noqa: E402

from epochlens.data import Dataset  # noqa: E402

#: The modules that take longest (minutes of Snakemake runs), slowest first: run before the others,
#: so that the workers of ``pytest -n N --dist loadfile --no-loadscope-reorder`` (``make test``)
#: finish together instead of one of them starting the end-to-end run last. Measured with
#: ``pytest --durations`` (setup + calls per module, two cores).
SLOWEST_FIRST = (
    "workflow/test_end_to_end.py",
    "cluster/test_slurm.py",
    "workflow/test_influence_workflow.py",
    "unit/core/test_scale_plan.py",
    "workflow/test_influence_shards_workflow.py",
    "workflow/test_workflow.py",
    "workflow/test_user_model_workflow.py",
    "workflow/test_train_command_workflow.py",
    "workflow/test_lop_study.py",
    "workflow/test_features_workflow.py",
    "workflow/test_causal_lm_workflow.py",
    "workflow/test_rerun_graph.py",
    "workflow/test_text_workflow.py",
    "workflow/test_stored_workflow.py",
    "workflow/test_curvature_workflow.py",
    "workflow/test_text_to_text_workflow.py",
    "workflow/test_regression_workflow.py",
    "workflow/test_probe_benchmark.py",
    "unit/influence/test_influence_exact.py",
    "unit/influence/test_influence_robust.py",
    "unit/influence/test_influence_causal_lm.py",
    "unit/influence/test_influence_text_to_text.py",
    "workflow/test_train_resume.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """With pytest-xdist workers (``make test``: one per core), one core's worth of threads each
    for torch, numpy and scikit-learn, unless set already: their default (every core in every
    worker) oversubscribes the cores, and the OpenMP threads of one worker spin while they wait
    for the others' (measured on 2 cores: tests/unit took 148 s and 289 CPU-s, 43 s and 80 CPU-s
    with one thread each). Snakemake sets its jobs' own (the rule's threads)."""
    # What epochlens.models.hf sets in a process that loads a model (nothing is downloaded), set
    # for the whole session: a test's in-process load would otherwise change, mid-session, the
    # import-time environment that tests/job_server.py compares, and later jobs would run unforked.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workers = len(getattr(config.option, "tx", None) or [])
    if workers and not hasattr(config, "workerinput"):  # in the controller, before workers start
        threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(variable, threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest modules first (:data:`SLOWEST_FIRST`), every module's tests in their order."""
    tests = Path(__file__).resolve().parent
    rank = {name: k for k, name in enumerate(SLOWEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.fspath)).resolve()
        return (
            rank.get(path.relative_to(tests).as_posix(), len(rank))
            if path.is_relative_to(tests)
            else len(rank)
        )

    items.sort(key=key)  # stable: the order within a module, and of the other modules, is kept


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded numpy generator, fresh for every test (seed 0; tests/quality.py's SEED when set)."""
    return np.random.default_rng(SEED)


@pytest.fixture
def tiny_dataset(rng: np.random.Generator) -> Dataset:
    """3 classes, RGB uint8 4x4 images: 12 train (4 per class, interleaved) and 6 test images."""
    return Dataset(
        name="tiny",
        source="conftest",
        train_images=rng.integers(0, 256, size=(12, 3, 4, 4), dtype=np.uint8),
        train_labels=np.tile(np.arange(3), 4),
        test_images=rng.integers(0, 256, size=(6, 3, 4, 4), dtype=np.uint8),
        test_labels=np.tile(np.arange(3), 2),
        num_classes=3,
        scale=1.0 / 255.0,
        mean=(0.5, 0.4, 0.3),
        std=(0.25, 0.2, 0.1),
        class_names=["cat", "dog", "fox"],
    )
