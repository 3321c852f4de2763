"""epochlens.runner: a step's exit. A step that used CUDA leaves without interpreter teardown once its
work is done (finished outputs must not be lost to an abort in PyTorch's teardown); a CPU step and a
failed step exit as before."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from epochlens import runner


class Exited(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


@pytest.fixture
def cuda_used(monkeypatch):
    """torch reports an initialised CUDA context; os._exit raises instead of ending pytest."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(True))

    def fake_exit(status: int) -> None:
        raise Exited(status)

    monkeypatch.setattr(runner.os, "_exit", fake_exit)
    monkeypatch.delenv("EPOCHLENS_FULL_TEARDOWN", raising=False)
    return synced


def test_a_cuda_step_ends_with_status_0_after_its_log_is_written(cuda_used, tmp_path):
    log_path = tmp_path / "job.log"
    with pytest.raises(Exited) as exited:
        runner.run_step(lambda: runner.log.info("outputs written"), log_path)
    assert exited.value.status == 0
    assert cuda_used == [True]  # device work finished before the process ends
    assert "outputs written" in log_path.read_text()  # the log was flushed and closed first


def test_a_failed_cuda_step_still_exits_1(cuda_used, tmp_path):
    def main() -> None:
        raise ValueError("broken")

    with pytest.raises(SystemExit) as exited:
        runner.run_step(main, tmp_path / "job.log")
    assert exited.value.code == 1
    assert "ValueError: broken" in (tmp_path / "job.log").read_text()


def test_full_teardown_can_be_asked_for(cuda_used, tmp_path, monkeypatch):
    monkeypatch.setenv("EPOCHLENS_FULL_TEARDOWN", "1")
    runner.run_step(lambda: None, tmp_path / "job.log")  # returns: Python's normal exit follows
    assert cuda_used == []


def test_a_cpu_step_returns(tmp_path):
    assert not torch.cuda.is_initialized()
    runner.run_step(lambda: None, tmp_path / "job.log")


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (as root; skipped where mounting is not allowed), unmounted afterwards."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)  # lazily: a failed writer's handle


def h5_write(path, array) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=array)


@pytest.mark.parametrize("kind", ["npy", "torch", "h5", "text"])
def test_a_full_disk_is_named_with_its_space_and_leaves_nothing_half_written(small_disk, kind, capsys):
    """Each writer the library uses, cut short by a full file system: one error naming the file
    system and its space (no traceback), no output and no temporary file left."""
    import numpy as np

    from epochlens.atomic import save_npy, write_atomic

    out = small_disk / "results" / f"out.{kind}"
    writers = {
        "npy": lambda: save_npy(out, np.zeros(10**6)),
        "torch": lambda: write_atomic(out, lambda p: torch.save(torch.zeros(10**6), p)),
        "h5": lambda: write_atomic(out, lambda p: h5_write(p, np.zeros(10**6))),
        "text": lambda: write_atomic(out, lambda p: p.write_text("x" * 3 * 10**6)),
    }
    with pytest.raises(SystemExit) as exit_:
        runner.run_step(writers[kind], small_disk / "logs" / "step.log")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "the file system is full" in err and f"mounted at {small_disk}" in err and "MiB free" in err, err
    assert "Traceback" not in err
    assert list((small_disk / "results").iterdir()) == []


H5_STEP = """
import sys
import numpy as np
from epochlens import runner
from epochlens.atomic_hdf5 import atomic_h5

def write():
    x = np.random.default_rng(0).standard_normal((8192, 64)).astype(np.float32)  # 2 MiB, incompressible
    with {opener} as f:
        f.create_dataset("x", data=x, chunks=(256, 64), compression="gzip")
        f.attrs["name"] = "x"

runner.run_step(write, sys.argv[2])
"""


def h5_step(out, log, opener: str) -> subprocess.CompletedProcess:
    script = H5_STEP.format(opener=opener)
    return subprocess.run([sys.executable, "-c", script, str(out), str(log)], capture_output=True, text=True)


def test_an_h5_file_cut_short_by_a_full_disk_fails_with_the_message_not_a_crash(small_disk):
    """HDF5 closing a chunked, compressed file whose write failed crashed the job (SIGSEGV, an
    empty log, the temporary file left: what `prepare_data` did on a full disk): atomic_h5 lets
    it close and raises the write's error, which the step reports as a full disk."""
    out, log = small_disk / "results" / "out.h5", small_disk / "logs" / "step.log"
    proc = h5_step(out, log, "atomic_h5(sys.argv[1])")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "the file system is full" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert list((small_disk / "results").iterdir()) == []
