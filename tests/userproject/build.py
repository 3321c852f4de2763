"""Builds the test user project (see the package docstring). Nothing here imports epochlens."""

from __future__ import annotations

import importlib
import io
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

TEMPLATE = Path(__file__).parent / "template"
CLASSES = ["cross", "ring", "square"]  # sorted, so ImageFolder ids equal ClassLabel ids
SOURCES = ["clean", "noisy"]
STORED_SIZE = 16  # pixels of the PNG files
SIZE = 8  # what the model sees
MEAN, STD = 0.5, 0.25
BATCH = 32
SAVE_EVERY = 30  # loop checkpoints: steps 0, 30, ..., 150 (6 steps per epoch)


@dataclass
class UserProject:
    root: Path
    project_path: Path  # put on sys.path: holds the package tinyvit
    factory: str
    kwargs: dict
    image_folder: Path
    saved_dataset: Path
    loop_dir: Path  # ckpt_{step}.pt
    trainer_dir: Path  # checkpoint-{step}/
    steps_per_epoch: int
    size: int = SIZE
    mean: tuple[float, float, float] = (MEAN,) * 3
    std: tuple[float, float, float] = (STD,) * 3
    # what was saved, to compare against what epochlens reads back
    loop_states: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    trainer_states: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    train_inputs: np.ndarray | None = None  # (N, 3, 8, 8) uint8 after the user's resize
    train_labels: np.ndarray | None = None
    test_inputs: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    test_sources: np.ndarray | None = None  # (N_test,) 0 clean / 1 noisy
    final_test_logits: torch.Tensor | None = None  # the loop's last checkpoint on the test split
    final_test_accuracy: float = 0.0


def _shape(kind: str, rng: np.random.Generator, noisy: bool) -> np.ndarray:
    """A 16x16 RGB image of a cross, ring or square, jittered, in a random bright colour."""
    n = STORED_SIZE
    yy, xx = np.mgrid[0:n, 0:n]
    cy, cx = rng.integers(6, 10, size=2)
    r = rng.integers(4, 6)
    if kind == "cross":
        mask = (np.abs(yy - cy) <= 1) & (np.abs(xx - cx) <= r) | (np.abs(xx - cx) <= 1) & (
            np.abs(yy - cy) <= r
        )
    elif kind == "ring":
        d = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
        mask = np.abs(d - r) <= 1.0
    else:
        mask = (np.abs(yy - cy) <= r - 1) & (np.abs(xx - cx) <= r - 1)
    colour = rng.integers(150, 256, size=3)
    image = rng.normal(30, 60 if noisy else 10, size=(n, n, 3))
    image[mask] = colour + rng.normal(0, 10, size=(int(mask.sum()), 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _user_preprocess(png: bytes) -> np.ndarray:
    """The user's own pipeline: decode, RGB, bilinear resize to 8x8 -> uint8 (3, 8, 8)."""
    with Image.open(io.BytesIO(png)) as im:
        small = im.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.asarray(small, dtype=np.uint8).transpose(2, 0, 1)


def normalise(images: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(images).float() / 255 - MEAN) / STD


def _write_data(root: Path, seed: int) -> dict[str, list[tuple[bytes, int, int]]]:
    """(png bytes, label, source) per split, in ImageFolder order; written as a folder and a
    save_to_disk DatasetDict."""
    import datasets

    rng = np.random.default_rng(seed)
    splits: dict[str, list[tuple[bytes, int, int]]] = {}
    for split, per_class in (("train", 64), ("test", 20)):
        rows = []
        for label, kind in enumerate(CLASSES):
            for i in range(per_class):
                source = int(i % 3 == 2)  # a third of each class from the noisy source
                png = _png(_shape(kind, rng, noisy=bool(source)))
                path = root / "data" / "shapes" / split / kind / f"{i:03d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(png)
                rows.append((png, label, source))
        splits[split] = rows
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=CLASSES),
            "source": datasets.Value("string"),
        }
    )
    dd = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "image": [{"bytes": png, "path": None} for png, _, _ in rows],
                    "label": [label for _, label, _ in rows],
                    "source": [SOURCES[s] for _, _, s in rows],
                },
                features=features,
            )
            for split, rows in splits.items()
        }
    )
    datasets.disable_progress_bars()
    dd.save_to_disk(str(root / "data" / "shapes_hf"))
    return splits


class _Shapes(torch.utils.data.Dataset):
    """The user's torch Dataset for the Trainer: {"pixel_values", "labels"}."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def _clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def build_user_project(
    root: Path, seed: int = 0, loop_epochs: int = 25, trainer_steps: int = 12
) -> UserProject:
    """Write the project under ``root`` and train it twice (a plain loop, then a Trainer)."""
    root = Path(root)
    code = root / "code"
    shutil.copytree(TEMPLATE, code)
    splits = _write_data(root, seed)
    x_train = np.stack([_user_preprocess(png) for png, _, _ in splits["train"]])
    y_train = np.array([label for _, label, _ in splits["train"]])
    x_test = np.stack([_user_preprocess(png) for png, _, _ in splits["test"]])
    y_test = np.array([label for _, label, _ in splits["test"]])
    steps_per_epoch = -(-len(y_train) // BATCH)
    project = UserProject(
        root=root,
        project_path=code,
        factory="tinyvit.model:build",
        kwargs={"dim": 16, "depth": 2, "heads": 2},
        image_folder=root / "data" / "shapes",
        saved_dataset=root / "data" / "shapes_hf",
        loop_dir=root / "runs" / "loop",
        trainer_dir=root / "runs" / "trainer",
        steps_per_epoch=steps_per_epoch,
        train_inputs=x_train,
        train_labels=y_train,
        test_inputs=x_test,
        test_labels=y_test,
        test_sources=np.array([s for _, _, s in splits["test"]]),
    )

    sys.path.insert(0, str(code))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is several times faster on a busy CPU
    try:
        tinyvit_model = importlib.import_module("tinyvit.model")
        _train_loop(project, tinyvit_model, seed, loop_epochs)
        _train_with_trainer(project, tinyvit_model, seed, trainer_steps)
    finally:
        torch.set_num_threads(threads)
        sys.path.remove(str(code))
        for name in [n for n in sys.modules if n == "tinyvit" or n.startswith("tinyvit.")]:
            del sys.modules[name]
    return project


def _train_loop(project: UserProject, tinyvit_model, seed: int, epochs: int) -> None:
    """The user's own loop: Adam, shuffled batches, {"model", "optimizer", "step"} every SAVE_EVERY steps."""
    torch.manual_seed(seed)
    model = tinyvit_model.build(**project.kwargs)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = normalise(project.train_inputs), torch.from_numpy(project.train_labels)
    project.loop_dir.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)

    def save(step: int) -> None:
        state = _clone(model.state_dict())
        torch.save(
            {"model": state, "optimizer": opt.state_dict(), "step": step},
            project.loop_dir / f"ckpt_{step}.pt",
        )
        project.loop_states[step] = state

    step = 0
    save(step)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(y), generator=gen).split(BATCH):
            loss = model(x[idx], labels=y[idx])["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % SAVE_EVERY == 0:
                save(step)
    model.eval()
    with torch.no_grad():
        logits = model(normalise(project.test_inputs))["logits"]
    project.final_test_logits = logits
    project.final_test_accuracy = float((logits.argmax(1).numpy() == project.test_labels).mean())


def _train_with_trainer(project: UserProject, tinyvit_model, seed: int, max_steps: int) -> None:
    """A Hugging Face Trainer run on CPU: a checkpoint every 4 steps, nothing reported or downloaded."""
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed + 1)
    model = tinyvit_model.build(**project.kwargs)
    states = project.trainer_states

    class KeepStates(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            states[state.global_step] = _clone(kwargs["model"].state_dict())

    args = TrainingArguments(
        output_dir=str(project.trainer_dir),
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=4,
        logging_steps=4,
        report_to="none",
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    data = _Shapes(normalise(project.train_inputs), torch.from_numpy(project.train_labels))
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[KeepStates()])
    trainer.remove_callback(PrinterCallback)  # no loss lines on stdout
    trainer.train()
