"""benchmarks/influence.py on its tiny transformers, without kronfluence: the inputs both libraries
score are well formed (padding where the mask is 0 and only there) and epochlens scores them.

The comparison with kronfluence itself needs kronfluence's own environment and is not run here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _common  # noqa: E402


def _benchmark():
    spec = importlib.util.spec_from_file_location("bench_influence", BENCHMARKS / "influence.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_token_batches_are_right_padded_with_token_0_where_the_mask_is_0() -> None:
    """GPT-2's classifier finds each sequence's last real token as the last one that is not padding
    (id 0): real tokens are never 0, padding always is, and lengths vary over 4..TEXT_LENGTH."""
    b = _common.token_batch(200, torch.Generator().manual_seed(0))
    ids, mask = b["input_ids"], b["attention_mask"]
    assert ids.shape == mask.shape == (200, _common.TEXT_LENGTH)
    assert ((ids != 0) == mask.bool()).all()
    lengths = mask.sum(1)
    assert lengths.min() >= 4 and lengths.max() == _common.TEXT_LENGTH and len(lengths.unique()) > 10
    assert (mask[:, :-1] >= mask[:, 1:]).all()  # right padding
    assert int(ids.max()) < _common.TEXT_VOCAB


@pytest.mark.parametrize(("name", "layers"), [("tiny_bert", 14), ("tiny_gpt2", 9)])
def test_the_benchmark_scores_its_tiny_transformers(name, layers, capsys) -> None:
    """Every nn.Linear (and GPT-2's Conv1D) tracked, no sample skipped, every score finite."""
    argv = ["--model", name, "--n-train", "8", "--n-query", "2", "--batch-size", "4"]
    assert _benchmark().main([*argv, "--fisher", "empirical", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layers_tracked"] == layers
    assert report["skipped_samples"] == 0 and report["scores_finite"]
