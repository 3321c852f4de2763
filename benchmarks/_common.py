"""What the benchmarks share: the library on the path, command-line options, thread settings, the
machine's description, interleaved A/B timing that keeps the best repeat, peak memory, and the
JSON report.

A benchmark defines ``bench_model(name, args, device) -> dict`` and an argument parser made by
:func:`parser`, then calls :func:`run`. Timings are taken on a machine that other jobs may share:
:func:`interleaved` alternates the order of the sides (A B, B A, ...) so that neither always runs
on a warmer or quieter machine, and keeps each side's fastest repeat; ``--threads 1`` keeps other
jobs' load out of the timings.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import pickle
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from epochlens.device import resolve_device  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

MODELS = ("small_cnn", "resnet18_lop")
#: Tiny Hugging Face models built from a config (nothing downloaded): see :func:`text_model`; the
#: sequence classifiers and a text-to-text T5 (:data:`SEQ2SEQ_MODELS`, task text_to_text).
TEXT_MODELS = ("tiny_bert", "tiny_gpt2", "tiny_t5")
SEQ2SEQ_MODELS = ("tiny_t5",)
#: Their vocabulary (token 0 is padding, 1 T5's eos) and the padded length of every sequence.
TEXT_VOCAB, TEXT_LENGTH = 100, 24
#: The longest target of the text-to-text model (tokens, its eos included).
TARGET_LENGTH = 6


def parser(doc: str, repeats: int = 2, more_models: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark has (model, device, seed, repeats,
    threads, json); ``doc`` is the benchmark's module docstring. ``both`` is the two image models;
    ``more_models`` are further choices of a benchmark that supports them."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model", choices=[*MODELS, *more_models, "both"], default="both")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=repeats, help="timings: the fastest repeat")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    return p


def run(p: argparse.ArgumentParser, bench_model: Callable, argv: list[str] | None = None) -> int:
    """Parse the options, set the threads, benchmark each model and print the JSON report."""
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    names = list(MODELS) if args.model == "both" else [args.model]
    reports = {}
    for name in names:
        if not args.json:
            print(f"benchmarking {name} on {device} ...", file=sys.stderr, flush=True)
        reports[name] = bench_model(name, args, device)
    print(json.dumps(reports[names[0]] if len(names) == 1 else reports, indent=2))
    return 0


def text_model(name: str) -> torch.nn.Module:
    """A tiny two-class sequence classifier of ``transformers`` from its config, randomly initialised
    (seed it first), in eval mode: ``tiny_bert`` (BERT: 2 layers, 2 heads, hidden 32, intermediate
    64; nn.Linear layers with a token dimension, then the pooler and classifier on the first token)
    or ``tiny_gpt2`` (GPT-2, the same sizes: its attention and MLP are ``Conv1D``; the ``score``
    Linear reads every token, the logits of the last real one are kept). Token 0 is padding; eager
    attention, so that both benchmarks' sides run the same kernels."""
    import transformers

    sizes = {"vocab_size": TEXT_VOCAB, "num_labels": 2, "pad_token_id": 0, "attn_implementation": "eager"}
    if name == "tiny_bert":
        config = transformers.BertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            **sizes,
        )
        return transformers.BertForSequenceClassification(config).eval()
    if name == "tiny_gpt2":
        config = transformers.GPT2Config(
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_inner=64,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
            **sizes,
        )
        return transformers.GPT2ForSequenceClassification(config).eval()
    if name == "tiny_t5":  # a text-to-text model: the same sizes, encoder and decoder of 2 blocks
        config = transformers.T5Config(
            vocab_size=TEXT_VOCAB,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            dropout_rate=0.0,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
            attn_implementation="eager",
        )
        return transformers.T5ForConditionalGeneration(config).eval()
    raise ValueError(f"unknown text model {name!r}; known: {', '.join(TEXT_MODELS)}")


def token_batch(n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` random sequences of 4..TEXT_LENGTH real tokens (ids 1..TEXT_VOCAB-1), right-padded with 0 to
    TEXT_LENGTH: ``{"input_ids", "attention_mask"}`` (n, TEXT_LENGTH) int64."""
    lengths = torch.randint(4, TEXT_LENGTH + 1, (n,), generator=generator)
    mask = (torch.arange(TEXT_LENGTH)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, TEXT_VOCAB, (n, TEXT_LENGTH), generator=generator) * mask
    return {"input_ids": ids, "attention_mask": mask}


def target_batch(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` random targets of 1..TARGET_LENGTH tokens (ids 2..TEXT_VOCAB-1, then eos 1), padded with
    -100 to TARGET_LENGTH: a text-to-text model's decoder labels (n, TARGET_LENGTH) int64."""
    lengths = torch.randint(1, TARGET_LENGTH + 1, (n,), generator=generator)
    ids = torch.randint(2, TEXT_VOCAB, (n, TARGET_LENGTH), generator=generator)
    positions = torch.arange(TARGET_LENGTH)[None, :]
    ids = torch.where(positions == lengths[:, None] - 1, torch.ones_like(ids), ids)
    return torch.where(positions < lengths[:, None], ids, torch.full_like(ids, -100))


def environment(device: torch.device) -> dict:
    """Where the timings were taken: device, its name, torch version, CPU threads, load average."""
    return {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "load_average_1min": load_average(),
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """1-minute load average: other jobs on a shared machine slow every stage."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable, device: torch.device) -> tuple[float, object]:
    """``(seconds, fn())``, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - t0, result


def best_of(repeats: int, fn: Callable, device: torch.device | None = None) -> tuple[float, object]:
    """The fastest of ``repeats`` calls of ``fn`` and the last result."""
    best, result = math.inf, None
    for _ in range(repeats):
        seconds, result = timed(fn, device or torch.device("cpu"))
        best = min(best, seconds)
    return best, result


def interleaved(
    sides: dict[str, Callable], repeats: int, device: torch.device, memory: bool = False
) -> tuple[dict[str, float], dict[str, object], dict[str, float]]:
    """Time each side ``repeats`` times, alternating their order (A B, B A, ...).

    Returns:
        ``(best seconds, last result, peak memory in MiB)`` per side (memory NaN unless asked).
    """
    names = list(sides)
    times = {n: math.inf for n in names}
    results: dict[str, object] = {}
    peaks = {n: (0.0 if memory else math.nan) for n in names}
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            if memory:
                with PeakMemory(device) as mem:
                    seconds, results[name] = timed(sides[name], device)
                peaks[name] = max(peaks[name], mem.peak_mib)
            else:
                seconds, results[name] = timed(sides[name], device)
            times[name] = min(times[name], seconds)
    return times, results, peaks


class PeakMemory:
    """Peak memory of a block: CUDA allocator peak, or the process's peak RSS on the CPU.

    On Linux the kernel's RSS high-water mark is reset through /proc/self/clear_refs; elsewhere a
    thread samples the RSS every 2 ms. Reported as the increase over the RSS at entry (MiB). Memory
    that the allocator kept from an earlier run would hide the next run's allocations, so glibc
    hands free memory back to the kernel first (malloc_trim).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mib = math.nan

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        _malloc_trim()
        self._base = _rss_bytes()
        self._hwm = _reset_hwm()
        if not self._hwm:
            self._stop = threading.Event()
            self._sampled = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._sampled = max(self._sampled, _rss_bytes())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self._hwm:
            peak = _status_kib("VmHWM") * 1024
        else:
            self._stop.set()
            self._thread.join()
            peak = self._sampled
        self.peak_mib = (peak - self._base) / 2**20


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _rss_bytes() -> int:
    try:
        return _status_kib("VmRSS") * 1024
    except (OSError, KeyError):
        import psutil  # not a dependency: only where /proc is missing

        return psutil.Process().memory_info().rss


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def write_cifar100(folder: Path, n_train: int, n_test: int) -> Path:
    """A ``cifar-100-python`` folder (train, test and meta pickles, as the original is laid out) of
    random pixels, the 100 classes in turn; returns it."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = rng.permutation(np.arange(n) % 100)
        data = {"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), "fine_labels": labels.tolist()}
        with open(folder / split, "wb") as f:
            pickle.dump({**data, "coarse_labels": (labels // 5).tolist()}, f, protocol=4)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"class_{c}" for c in range(100)]}, f, protocol=4)
    return folder


def write_image_folder(folder: Path, n_train: int, n_test: int) -> Path:
    """An ImageFolder tree (``{train,test}/class_{c:03d}/{i}.png``) of random 32 x 32 RGB pixels, the
    100 classes in turn, as :func:`write_cifar100` draws them; returns it."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = rng.permutation(np.arange(n) % 100)
        for c in range(100):
            (folder / split / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
        for lo in range(0, n, 10_000):
            pixels = rng.integers(0, 256, size=(min(n, lo + 10_000) - lo, 32, 32, 3), dtype=np.uint8)
            for i, image in enumerate(pixels, start=lo):
                Image.fromarray(image).save(folder / split / f"class_{labels[i]:03d}" / f"{i}.png")
    return folder


def write_npz(path: Path, n_train: int, n_test: int) -> Path:
    """An ``.npz`` of x_train (N, 3, 32, 32) uint8, y_train, x_test, y_test: random pixels, the 100
    classes in turn; returns it."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        arrays[f"y_{split}"] = rng.permutation(np.arange(n) % 100)
        arrays[f"x_{split}"] = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def lop_config(cifar: Path, lop: Path) -> dict:
    """config/cifar100_lop.yaml with its data at ``cifar``, its class orders and checkpoints in the
    original experiment's layout under ``lop`` (class_order/, model_parameters/)."""
    cfg = yaml.safe_load((REPO / "config/cifar100_lop.yaml").read_text())
    run = cfg["runs"]["cifar100_lop"]
    run["data"]["path"] = str(cifar)
    run["class_order"]["path"] = str(lop / "class_order/index-{index}.npy")
    run["checkpoints"]["path"] = str(lop / "model_parameters/index-{index}_epoch-{epoch}.pt")
    return cfg
