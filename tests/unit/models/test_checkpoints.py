"""Checkpoint IO (bare state_dicts saved from CUDA, DataParallel, wrappers, corrupt files), atomic
writes and the error hierarchy."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
import torch.serialization

from epochlens.atomic import atomic_path, save_npy, write_atomic, write_json
from epochlens.checkpoints import load_into, load_state_dict, save_state_dict
from epochlens.errors import (
    CheckpointError,
    ClassOrderError,
    ConfigError,
    DataError,
    EpochlensError,
)
from epochlens.models.networks import ResNet18LoP, SmallCNN
from epochlens.provenance import file_sha256


def _perturbed_small_cnn(num_classes: int = 3, seed: int = 0) -> SmallCNN:
    """A SmallCNN whose parameters and BN buffers differ from a fresh one (so loading matters)."""
    torch.manual_seed(seed)
    model = SmallCNN(num_classes=num_classes)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.rand_like(tensor))
            else:
                tensor.fill_(7)
    return model


@contextlib.contextmanager
def _saved_from_cuda():
    """Make torch.save record every storage as living on 'cuda:0', as on the training cluster."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        yield


def _save_cuda_tagged(obj, path) -> None:
    with _saved_from_cuda():
        torch.save(obj, path)


def _assert_same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


# ---------------------------------------------------------------- save / load


def test_save_state_dict_round_trip(tmp_path):
    model = _perturbed_small_cnn()
    path = tmp_path / "checkpoints" / "epoch_0200.pt"
    save_state_dict(model, path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["epoch_0200.pt"]  # no temp file
    state = load_state_dict(path)
    _assert_same_state(state, model.state_dict())
    assert all(v.device.type == "cpu" for v in state.values())
    # A bare state_dict, loadable by the original experiment's code.
    plain = torch.load(path, weights_only=True)
    assert set(plain) == set(model.state_dict())

    fresh = load_into(SmallCNN(num_classes=3), path).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), model.eval()(x))


def test_save_state_dict_overwrites_atomically(tmp_path):
    path = tmp_path / "epoch_0000.pt"
    save_state_dict(_perturbed_small_cnn(seed=0), path)
    second = _perturbed_small_cnn(seed=1)
    save_state_dict(second, path)
    _assert_same_state(load_state_dict(path), second.state_dict())


def test_file_sha256(tmp_path):
    path = tmp_path / "blob.bin"
    data = os.urandom(3000)
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(path, chunk=7) == hashlib.sha256(data).hexdigest()


def test_checkpoint_saved_from_cuda_loads_on_cpu(tmp_path):
    model = _perturbed_small_cnn()
    path = tmp_path / "model_parameters" / "index-0_epoch-200.pt"
    path.parent.mkdir()
    _save_cuda_tagged(model.state_dict(), path)

    # The file really records CUDA storages ...
    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        assert b"cuda:0" in z.read(pkl)
    if not torch.cuda.is_available():
        # ... so a plain load without map_location fails on a CPU-only machine,
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)
    # ... and load_state_dict still reads it onto the CPU.
    state = load_state_dict(path)
    assert all(v.device.type == "cpu" for v in state.values())
    _assert_same_state(state, model.state_dict())
    load_into(SmallCNN(num_classes=3), path)


@pytest.fixture(scope="module")
def lop_checkpoint(tmp_path_factory):
    """A ResNet18LoP checkpoint as the loss-of-plasticity experiment writes it (CUDA, bare)."""
    torch.manual_seed(0)
    model = ResNet18LoP(num_classes=100)
    path = tmp_path_factory.mktemp("lop") / "model_parameters" / "index-0_epoch-200.pt"
    path.parent.mkdir()
    _save_cuda_tagged(model.state_dict(), path)
    return path, model


def test_lop_checkpoint_loads_into_resnet18_lop(lop_checkpoint):
    path, model = lop_checkpoint
    fresh = load_into(ResNet18LoP(num_classes=100), path)
    torch.testing.assert_close(fresh.fc.weight, model.fc.weight, rtol=0, atol=0)
    torch.testing.assert_close(
        fresh.layer3[0].downsample[0].bias, model.layer3[0].downsample[0].bias, rtol=0, atol=0
    )


def test_load_into_wrong_number_of_classes(lop_checkpoint):
    path, _ = lop_checkpoint
    target = ResNet18LoP(num_classes=10)
    before = target.fc.weight.detach().clone()
    with pytest.raises(CheckpointError) as err:
        load_into(target, path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: the state_dict does not fit model ResNet18LoP")
    assert "fc.bias: file (100,) vs model (10,)" in msg
    assert "fc.weight: file (100, 512) vs model (10, 512)" in msg
    assert "missing keys" not in msg and "unexpected keys" not in msg
    torch.testing.assert_close(target.fc.weight, before)  # the model was left alone


def test_load_into_wrong_architecture_lists_keys(lop_checkpoint):
    path, _ = lop_checkpoint
    with pytest.raises(CheckpointError) as err:
        load_into(SmallCNN(num_classes=100), path)
    msg = str(err.value)
    assert str(path) in msg and "model SmallCNN" in msg
    # 142 ResNet keys vs 20 SmallCNN keys; only fc.weight and fc.bias are shared.
    assert "unexpected keys ['bn1.bias', 'bn1.num_batches_tracked'" in msg
    assert "and 134 more" in msg  # 140 unexpected, 6 shown
    assert "missing keys ['block1.0.weight'" in msg and "and 12 more" in msg  # 18 missing
    assert "fc.weight: file (100, 512) vs model (100, 64)" in msg
    assert "model.name" in msg  # says what to do


def test_data_parallel_prefix_is_stripped(tmp_path):
    model = _perturbed_small_cnn()
    path = tmp_path / "dp.pt"
    _save_cuda_tagged({f"module.{k}": v for k, v in model.state_dict().items()}, path)
    state = load_state_dict(path)
    assert not any(k.startswith("module.") for k in state)
    _assert_same_state(state, model.state_dict())
    load_into(SmallCNN(num_classes=3), path)


def test_partial_module_prefix_is_kept_and_reported(tmp_path):
    sd = _perturbed_small_cnn().state_dict()
    first = next(iter(sd))
    mixed = {(f"module.{k}" if k == first else k): v for k, v in sd.items()}
    path = tmp_path / "mixed.pt"
    torch.save(mixed, path)
    assert f"module.{first}" in load_state_dict(path)
    with pytest.raises(CheckpointError, match=rf"missing keys \['{first}'\].*unexpected keys"):
        load_into(SmallCNN(num_classes=3), path)


@pytest.mark.parametrize("wrapper", ["state_dict", "model_state_dict", "model_weights", "model"])
def test_wrapped_state_dicts_are_unwrapped(tmp_path, wrapper):
    model = _perturbed_small_cnn()
    path = tmp_path / "wrapped.pt"
    inner = {f"module.{k}": v for k, v in model.state_dict().items()}
    _save_cuda_tagged({"epoch": 200, wrapper: inner, "optimizer": {"lr": 0.1}}, path)
    _assert_same_state(load_state_dict(path), model.state_dict())


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ([torch.zeros(2)], "expected a state_dict"),
        ({"weight": torch.zeros(2), "epoch": 3}, "expected a state_dict"),
        (torch.zeros(3), "expected a state_dict"),
    ],
)
def test_not_a_state_dict(tmp_path, obj, match):
    path = tmp_path / "odd.pt"
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match=match) as err:
        load_state_dict(path)
    assert str(path) in str(err.value)


def test_pickled_module_is_refused(tmp_path):
    path = tmp_path / "whole_model.pt"
    torch.save(SmallCNN(num_classes=3), path)
    with pytest.raises(CheckpointError, match="not a bare state_dict") as err:
        load_state_dict(path)
    assert str(path) in str(err.value)


def _checkpoint_bytes(tmp_path) -> bytes:
    path = tmp_path / "good.pt"
    _save_cuda_tagged(_perturbed_small_cnn().state_dict(), path)
    return path.read_bytes()


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], id="half"),
        pytest.param(lambda raw: raw[:-20], id="tail"),
        pytest.param(lambda raw: b"", id="empty"),
    ],
)
def test_truncated_checkpoint(tmp_path, cut):
    path = tmp_path / "index-0_epoch-400.pt"
    path.write_bytes(cut(_checkpoint_bytes(tmp_path)))
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_state_dict(path)
    assert str(path) in str(err.value)


def test_garbage_checkpoint(tmp_path):
    path = tmp_path / "index-0_epoch-400.pt"
    path.write_bytes(b"<html><body>404 Not Found</body></html>\n")
    with pytest.raises(CheckpointError) as err:
        load_state_dict(path)
    assert str(path) in str(err.value)


def test_missing_checkpoint(tmp_path):
    path = tmp_path / "model_parameters" / "index-0_epoch-600.pt"
    with pytest.raises(CheckpointError, match="checkpoint not found") as err:
        load_state_dict(path)
    assert str(path) in str(err.value)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_into(SmallCNN(num_classes=3), path)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_state_dict(tmp_path)  # a folder is not a checkpoint


# ---------------------------------------------------------------- atomic writes


class Boom(Exception):
    pass


def test_failing_writer_leaves_nothing_behind(tmp_path):
    path = tmp_path / "out" / "result.json"

    def writer(tmp):
        tmp.write_text("half of it")
        raise Boom

    with pytest.raises(Boom):
        write_atomic(path, writer)
    assert not path.exists()
    assert list(path.parent.iterdir()) == []  # no temp file either


def test_interrupt_leaves_nothing_behind(tmp_path):
    path = tmp_path / "result.npy"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(path) as tmp:
            np.save(tmp.open("wb"), np.zeros(3))
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def dead_pid() -> int:
    """The id of a process that has ended."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    """A writer SIGKILLed mid-write cannot delete its temporary (benchmarks/faults.py --kill found
    one left beside a stored-activation feature file): the next write of that file removes it,
    and keeps a temporary of a process still running."""
    path = tmp_path / "pooled.h5"
    orphan = tmp_path / f".pooled.h5.pid{dead_pid()}-abc.tmp"
    running = tmp_path / f".pooled.h5.pid{os.getpid()}-def.tmp"
    other = tmp_path / f".pooled.h5x.pid{dead_pid()}-ghi.tmp"  # another file's
    for p in (orphan, running, other):
        p.write_text("half of it")
    write_json(path, {"epoch": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["pooled.h5", running.name, other.name])


def test_failing_writer_keeps_the_previous_file(tmp_path):
    path = tmp_path / "metadata.json"
    write_json(path, {"epoch": 1})
    with pytest.raises(TypeError):
        write_json(path, {"epoch": object()})
    assert json.loads(path.read_text()) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["metadata.json"]


def test_atomic_path_writes_next_to_the_destination(tmp_path):
    path = tmp_path / "a" / "b" / "x.bin"
    with atomic_path(path) as tmp:
        assert tmp.parent == path.parent  # same file system, so the rename is atomic
        assert tmp.name.startswith(".x.bin.") and tmp != path
        assert not path.exists()
        tmp.write_bytes(b"123")
    assert path.read_bytes() == b"123"
    assert [p.name for p in path.parent.iterdir()] == ["x.bin"]


def test_write_json_is_sorted_and_indented(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"b": 1, "a": [1, 2]})
    assert path.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'


def test_save_npy_keeps_the_name(tmp_path):
    path = tmp_path / "per_image_curvature.npy"
    save_npy(path, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(np.load(path), np.arange(4, dtype=np.float32))
    save_npy(tmp_path / "no_suffix", np.arange(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no_suffix", "per_image_curvature.npy"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomic_files_get_the_usual_permissions(tmp_path, umask):
    """Results are as readable as any file the user creates (mkstemp alone would give 0600)."""
    old = os.umask(umask)
    try:
        write_json(tmp_path / "m.json", {})
        save_state_dict(SmallCNN(num_classes=2), tmp_path / "c.pt")
    finally:
        os.umask(old)
    for name in ("m.json", "c.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


# ---------------------------------------------------------------- errors


def test_error_hierarchy():
    for cls in (CheckpointError, ClassOrderError, ConfigError, DataError):
        assert issubclass(cls, EpochlensError)
        assert not issubclass(cls, OSError)
    assert issubclass(EpochlensError, RuntimeError)
    with pytest.raises(EpochlensError):
        load_state_dict("/nonexistent/epochlens/test/checkpoint.pt")
