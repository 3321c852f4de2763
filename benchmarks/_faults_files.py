"""Bad input files read as a job reads them: checkpoints, ``.npz`` data and ``cifar-100-python``
folders (``benchmarks/faults.py --inputs``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from _faults_outcome import Case  # noqa: E402


def tiny_dataset(root: Path) -> tuple[Path, Path]:
    """The tiny run's dataset.h5 and class_order.npy, made as its jobs make them."""
    from epochlens.atomic import save_npy
    from epochlens.data import holdout_mask, load_source, write_dataset
    from epochlens.schedule import make_class_order

    dataset = load_source("digits")
    dataset.holdout = holdout_mask(dataset.train_labels, 5)
    write_dataset(dataset, root / "dataset.h5")
    save_npy(root / "class_order.npy", make_class_order(dataset.num_classes, 0))
    return root / "dataset.h5", root / "class_order.npy"


SCHEDULE = {"initial_classes": 4, "increment": 3, "epochs_per_task": 2}


def evaluated(dataset: Path, order: Path, checkpoint: Path, model="small_cnn") -> Callable[[], None]:
    """What evaluate_checkpoint does with a checkpoint: load it into the model and evaluate it."""

    def check() -> None:
        from epochlens.evaluation import evaluate_checkpoint
        from epochlens.job import load_checkpoint_job

        job = load_checkpoint_job(dataset, checkpoint, model, 2, "cpu", order, SCHEDULE)
        evaluate_checkpoint(job.model, job.data, job.schedule, job.epoch, 256, job.device)

    return check


def checkpoint_cases(root: Path, dataset: Path, order: Path) -> list[Case]:
    import torch
    from safetensors.torch import save_file

    from epochlens.models.networks import SmallCNN, build_model

    torch.manual_seed(0)
    good = SmallCNN(num_classes=10).state_dict()
    first = next(iter(good))
    variants: dict[str, object] = {
        "NaN weights": {k: v.clone().fill_(float("nan")) if k == first else v for k, v in good.items()},
        "Inf weights": {k: v.clone().fill_(float("inf")) if k == first else v for k, v in good.items()},
        "a tensor missing": {k: v for k, v in good.items() if k != first},
        "an extra tensor": {**good, "extra.weight": torch.zeros(3)},
        "another architecture (resnet18_lop)": build_model("resnet18_lop", 10, 1).state_dict(),
        "another class count (5)": SmallCNN(num_classes=5).state_dict(),
        "float16 weights with NaN": {
            k: v.half().fill_(float("nan")) if k == first else v.half() for k, v in good.items()
        },
    }
    cases = []
    for fmt in ("pt", "safetensors"):
        folder = root / f"checkpoints-{fmt}"
        folder.mkdir()
        files = {}
        for name, state in variants.items():
            path = folder / f"{len(files)}.{fmt}"
            if fmt == "pt":
                torch.save(state, path)
            else:
                save_file({k: v.contiguous() for k, v in state.items()}, str(path))
            files[name] = path
        whole = folder / f"whole.{fmt}"
        (torch.save(good, whole) if fmt == "pt" else save_file(good, str(whole)))
        data = whole.read_bytes()
        for name, content in {
            "truncated to half": data[: len(data) // 2],
            "truncated to 10 bytes": data[:10],
            "empty": b"",
            "text, not a checkpoint": b"this is not a checkpoint\n",
        }.items():
            path = folder / f"{len(files)}.{fmt}"
            path.write_bytes(content)
            files[name] = path
        if fmt == "pt":
            for name, obj in {
                "a list, not a state_dict": [1, 2, 3],
                "a dict without tensors": {"epoch": 3, "lr": 0.1},
                "a state_dict under an unknown key": {"weights_v2": {"w": good}},
            }.items():
                path = folder / f"{len(files)}.pt"
                torch.save(obj, path)
                files[name] = path
        (folder / "a folder.pt").mkdir()
        files["a folder, not a file"] = folder / "a folder.pt"
        for name, path in files.items():
            cases.append(Case(f"checkpoint (.{fmt})", name, (str(path),), evaluated(dataset, order, path)))
    return cases


def prepared(source: str, path: Path, task: str = "classification", **options) -> Callable[[], None]:
    """What prepare_data does with a data set: read it, check it fits the task, split the holdout."""

    def check() -> None:
        from epochlens.data import holdout_mask, load_source
        from epochlens.data.dataset import check_kind

        dataset = load_source(source, str(path), **options)
        check_kind(dataset, task)
        holdout_mask(dataset.train_labels, 0)

    return check


def npz_arrays(rng: np.random.Generator, regression: bool = False) -> dict[str, np.ndarray]:
    x_train, x_test = rng.standard_normal((60, 1, 4, 4)), rng.standard_normal((20, 1, 4, 4))
    if regression:
        return {
            "x_train": x_train,
            "y_train": rng.standard_normal((60, 2)),
            "x_test": x_test,
            "y_test": rng.standard_normal((20, 2)),
        }
    return {"x_train": x_train, "y_train": np.arange(60) % 3, "x_test": x_test, "y_test": np.arange(20) % 3}


def npz_cases(root: Path) -> list[Case]:
    rng = np.random.default_rng(0)
    folder = root / "npz"
    folder.mkdir()

    def edit(**changes):
        def make(regression=False):
            arrays = npz_arrays(rng, regression)
            for key, fn in changes.items():
                if fn is None:
                    del arrays[key]
                else:
                    arrays[key] = fn(arrays[key])
            return arrays

        return make

    def nan_at(a):
        a = a.astype(np.float64)
        a.flat[3] = np.nan
        return a

    def inf_at(a):
        a = a.astype(np.float64)
        a.flat[0] = np.inf
        return a

    variants = {
        "NaN in x_train": (edit(x_train=nan_at), "classification"),
        "Inf in x_test": (edit(x_test=inf_at), "classification"),
        "NaN in regression y_train": (
            lambda: {**npz_arrays(rng, True), "y_train": nan_at(rng.standard_normal((60, 2)))},
            "regression",
        ),
        "Inf in regression y_test": (
            lambda: {**npz_arrays(rng, True), "y_test": inf_at(rng.standard_normal((20, 2)))},
            "regression",
        ),
        "x_test of another shape": (edit(x_test=lambda a: a[:, :, :3]), "classification"),
        "x_train 1-D": (edit(x_train=lambda a: a.reshape(-1)[:60]), "classification"),
        "y_train shorter than x_train": (edit(y_train=lambda a: a[:50]), "classification"),
        "x_test longer than y_test": (edit(x_test=lambda a: np.concatenate([a, a])), "classification"),
        "negative class id": (edit(y_train=lambda a: a - 1), "classification"),
        "class ids as floats (classification)": (
            edit(y_train=lambda a: a.astype(np.float32), y_test=lambda a: a.astype(np.float32)),
            "classification",
        ),
        "integer targets (regression)": (edit(), "regression"),
        "y_train 2-D class ids": (edit(y_train=lambda a: a.reshape(-1, 1)), "classification"),
        "x_train missing": (edit(x_train=None), "classification"),
        "empty training split": (edit(x_train=lambda a: a[:0], y_train=lambda a: a[:0]), "classification"),
        "string labels": (
            edit(y_train=lambda a: a.astype(str), y_test=lambda a: a.astype(str)),
            "classification",
        ),
        "object array": (edit(x_train=lambda a: a.astype(object)), "classification"),
    }
    cases = []
    for k, (name, (make, task)) in enumerate(variants.items()):
        path = folder / f"{k}.npz"
        np.savez(path, **make())
        cases.append(Case("data (.npz)", name, (str(path),), prepared("npz", path, task)))
    whole = folder / "whole.npz"
    np.savez(whole, **npz_arrays(rng))
    for name, content in {"truncated": whole.read_bytes()[:300], "empty": b"", "text": b"x,y\n1,2\n"}.items():
        path = folder / f"{name}.npz"
        path.write_bytes(content)
        cases.append(Case("data (.npz)", f"file {name}", (str(path),), prepared("npz", path)))
    return cases


def cifar_cases(root: Path) -> list[Case]:
    import pickle

    def write(
        folder: Path,
        labels_offset: int = 0,
        drop: str | None = None,
        rows: int = 3072,
        truncate: str | None = None,
    ):
        folder.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for split, n in (("train", 200), ("test", 100)):
            labels = (np.arange(n) % 100 + labels_offset).tolist()
            d = {
                "filenames": [f"{i}.png" for i in range(n)],
                "fine_labels": labels,
                "coarse_labels": [0] * n,
                "data": rng.integers(0, 256, (n, rows), dtype=np.uint8),
            }
            if drop:
                d.pop(drop)
            (folder / split).write_bytes(pickle.dumps(d, protocol=2))
        (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [str(c) for c in range(100)]}))
        if truncate:
            data = (folder / truncate).read_bytes()
            (folder / truncate).write_bytes(data[: len(data) // 2])
        return folder

    base = root / "cifar"
    variants = {
        "train truncated": dict(truncate="train"),
        "labels out of range (100..199)": dict(labels_offset=100),
        "negative labels": dict(labels_offset=-1),
        "no fine_labels": dict(drop="fine_labels"),
        "no data": dict(drop="data"),
        "rows of 1000 bytes (not 32x32x3)": dict(rows=1000),
    }
    cases = []
    for k, (name, kwargs) in enumerate(variants.items()):
        folder = write(base / str(k), **kwargs)
        cases.append(Case("data (cifar-100-python)", name, (str(folder),), prepared("cifar100", folder)))
    folder = write(base / "nometa")
    (folder / "meta").unlink()
    (folder / "test").unlink()
    cases.append(
        Case("data (cifar-100-python)", "no test file", (str(folder),), prepared("cifar100", folder))
    )
    return cases
