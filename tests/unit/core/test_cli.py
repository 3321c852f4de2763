"""The epochlens command (doctor) and device selection."""

from __future__ import annotations

import json

import pytest
import torch

from epochlens.cli import main
from epochlens.device import device_for_dtype, resolve_device, supports_float64
from epochlens.doctor import run_doctor
from epochlens.errors import ConfigError


def test_doctor_on_this_cpu_is_ready(capsys):
    assert main(["doctor", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "ready on cpu"
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["torch"]["detail"] == torch.__version__
    assert checks["float64"]["status"] == "ok"
    assert checks["curvature"]["status"] == "ok" and "samples/s" in checks["curvature"]["detail"]


def test_doctor_names_an_unavailable_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["doctor", "--device", "cuda"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] device" in out and "this process sees no CUDA device" in out
    assert "verdict: NOT READY: device failed" in out


def test_doctor_fails_when_the_curvature_run_disagrees(monkeypatch):
    monkeypatch.setattr("epochlens.doctor.FLOAT32_TOLERANCE", 0.0)
    checks, verdict = run_doctor("cpu")
    assert verdict == "NOT READY: curvature failed (see above)"


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("epochlens 0.")
    with pytest.raises(SystemExit):
        main([])  # a command is required
    assert "doctor" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpu", "cuda:99", "tpu"])
def test_bad_device_is_a_config_error(name):
    if name == "cuda:99" and not torch.cuda.is_available():
        match = "sees no CUDA device"
    else:
        match = "device"
    with pytest.raises(ConfigError, match=match):
        resolve_device(name)


def test_float64_falls_back_to_the_cpu_on_mps_only():
    assert not supports_float64(torch.device("mps"))
    assert device_for_dtype(torch.device("mps"), torch.float64) == torch.device("cpu")
    assert device_for_dtype(torch.device("mps"), torch.float32) == torch.device("mps")
    assert device_for_dtype(torch.device("cpu"), torch.float64) == torch.device("cpu")
