"""Bad input folders: Hugging Face checkpoints and tokenizers, stored activations
(``benchmarks/faults.py --inputs``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from _faults_files import npz_arrays  # noqa: E402
from _faults_outcome import MISSING, Case  # noqa: E402


def hf_loaded(folder: Path) -> Callable[[], None]:
    """What a job does with a Hugging Face checkpoint folder (epochlens.job: _build_hf_model)."""

    def check() -> None:
        from epochlens.models.hf import load_hf_model

        load_hf_model(folder, num_labels=2, pad_token_id=0, vocab_size=100)

    return check


def tokenizer_loaded(folder: Path) -> Callable[[], None]:
    def check() -> None:
        from epochlens.formats.tokens import load_tokenizer

        load_tokenizer(folder)

    return check


def hf_cases(root: Path) -> list[Case]:
    """Checkpoint folders of a tiny BERT (save_pretrained), each broken one way; tokenizer folders."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig

    from epochlens.models.hf import write_tiny_model

    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, vocab_size=100, num_labels=2, pad_token_id=0,
    )  # fmt: skip
    good = write_tiny_model(root / "hf" / "good", config)
    weights = good / "model.safetensors"

    def broken(name: str, fix: Callable[[Path], None]) -> Case:
        folder = root / "hf" / name.replace(" ", "_")
        shutil.copytree(good, folder)
        fix(folder)
        return Case("Hugging Face folder", name, (str(folder),), hf_loaded(folder))

    def nan(folder: Path) -> None:
        state = load_file(str(folder / "model.safetensors"))
        first = next(k for k, v in state.items() if v.is_floating_point())
        state[first] = torch.full_like(state[first], float("nan"))
        save_file(state, str(folder / "model.safetensors"))

    other = BertConfig(
        hidden_size=48, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    cases = [
        broken("no config.json", lambda f: (f / "config.json").unlink()),
        broken("config.json not JSON", lambda f: (f / "config.json").write_text("{model_type: bert")),
        broken(
            "config.json of an unknown model_type",
            lambda f: (f / "config.json").write_text('{"model_type": "nonesuch"}'),
        ),
        broken("config.json of another size", lambda f: other.save_pretrained(f)),
        broken("no weights", lambda f: (f / "model.safetensors").unlink()),
        broken(
            "weights truncated", lambda f: (f / "model.safetensors").write_bytes(weights.read_bytes()[:2000])
        ),
        broken("weights empty", lambda f: (f / "model.safetensors").write_bytes(b"")),
        broken("NaN weights", nan),
    ]
    empty = root / "hf" / "tokenizer-empty"
    empty.mkdir()
    bad = root / "hf" / "tokenizer-broken"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    cases += [
        Case("tokenizer folder", "no tokenizer files", (str(empty),), tokenizer_loaded(empty)),
        Case("tokenizer folder", "tokenizer.json broken", (str(bad),), tokenizer_loaded(bad)),
        Case(
            "tokenizer folder",
            "missing folder",
            (f"{MISSING}/tok",),
            tokenizer_loaded(Path(f"{MISSING}/tok")),
        ),
    ]
    return cases


def stored_built(folder: Path, data) -> Callable[[], None]:
    """What the features job of a stored-activations run does with a snapshot folder."""

    def check() -> None:
        from epochlens.features.stored import load_or_build
        from epochlens.features.stored_settings import StoredFeatureSettings

        load_or_build(folder.parent / f"{folder.name}.h5", folder, data, StoredFeatureSettings())

    return check


def stored_cases(root: Path) -> list[Case]:
    """Snapshots of stored activations (``npy`` layout: ``{split}/{layer}.npy``) of a 60 + 20
    sample data set, each broken one way."""
    from epochlens.data import load_source

    rng = np.random.default_rng(0)
    np.savez(root / "stored-data.npz", **npz_arrays(rng))
    data = load_source("npz", str(root / "stored-data.npz"))
    sizes = {"train": 60, "test": 20}

    def snapshot(name: str, fix: Callable[[Path], None]) -> Case:
        folder = root / "stored" / name.replace(" ", "_")
        for split, n in sizes.items():
            (folder / split).mkdir(parents=True)
            for layer in ("block1", "block2"):
                np.save(folder / split / f"{layer}.npy", rng.standard_normal((n, 8)).astype(np.float32))
        fix(folder)
        return Case("stored activations", name, (str(folder),), stored_built(folder, data))

    def nan(folder: Path) -> None:
        a = np.load(folder / "train" / "block1.npy")
        a[5, 2] = np.nan
        np.save(folder / "train" / "block1.npy", a)

    npy = "train/block1.npy"
    return [
        snapshot("a layer missing in test", lambda f: (f / "test" / "block2.npy").unlink()),
        snapshot("rows missing (50 of 60)", lambda f: np.save(f / npy, np.zeros((50, 8), np.float32))),
        snapshot("rows extra (70 of 60)", lambda f: np.save(f / npy, np.zeros((70, 8), np.float32))),
        snapshot(
            "no test split", lambda f: [p.unlink() for p in (f / "test").iterdir()] and (f / "test").rmdir()
        ),
        snapshot("a layer truncated", lambda f: (f / npy).write_bytes((f / npy).read_bytes()[:200])),
        snapshot("a layer empty", lambda f: (f / npy).write_bytes(b"")),
        snapshot("one number per row", lambda f: np.save(f / npy, np.zeros(60, np.float32))),
        snapshot("NaN activations", nan),
        snapshot(
            "test layer of another width",
            lambda f: np.save(f / "test" / "block1.npy", np.zeros((20, 5), np.float32)),
        ),
        snapshot("no layers", lambda f: [p.unlink() for s in sizes for p in (f / s).iterdir()]),
    ]


# ---------------------------------------------------------------------------------------------
# The report
