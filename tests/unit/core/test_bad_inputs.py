"""Bad inputs (a subset of ``benchmarks/faults.py --inputs``): each ends in an epochlens error that
names the key or the file, never a Python traceback and never a result computed from it. The
inputs that issue 33's corpus found passing silently or with a traceback are all here: NaN or Inf
weights (a .pt, a safetensors file, a Hugging Face folder), NaN or Inf inputs of an .npz, an empty
split, an array of Python objects, CIFAR-100 labels out of 0..99, truncated or empty weights of a
Hugging Face folder, an empty .npy of stored activations, a layer stored with another shape in
the test split than in the training split, a layer stored as one number per row in the training
split only (it was left out of the layers silently).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"

# (family, input): found by the corpus (silent or a traceback before their fix), then a sample
FOUND = [
    ("checkpoint (.pt)", "NaN weights"),
    ("checkpoint (.pt)", "Inf weights"),
    ("checkpoint (.pt)", "float16 weights with NaN"),
    ("checkpoint (.safetensors)", "NaN weights"),
    ("data (.npz)", "NaN in x_train"),
    ("data (.npz)", "Inf in x_test"),
    ("data (.npz)", "empty training split"),
    ("data (.npz)", "object array"),
    ("data (cifar-100-python)", "labels out of range (100..199)"),
    ("data (cifar-100-python)", "negative labels"),
    ("Hugging Face folder", "weights truncated"),
    ("Hugging Face folder", "weights empty"),
    ("Hugging Face folder", "NaN weights"),
    ("stored activations", "a layer empty"),
    ("stored activations", "test layer of another width"),
    ("stored activations", "one number per row"),  # in train only: the layer was dropped silently
]
SAMPLE = [
    ("checkpoint (.pt)", "another architecture (resnet18_lop)"),
    ("checkpoint (.safetensors)", "truncated to half"),
    ("data (.npz)", "y_train shorter than x_train"),
    ("data (.npz)", "class ids as floats (classification)"),
    ("data (cifar-100-python)", "train truncated"),
    ("Hugging Face folder", "no config.json"),
    ("tokenizer folder", "no tokenizer files"),
    ("stored activations", "rows missing (50 of 60)"),
]


def _faults():
    spec = importlib.util.spec_from_file_location("bench_faults", BENCHMARKS / "faults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_faults"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


faults = _faults()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """The corpus's file inputs by (family, input), made once."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("faults")
    dataset, order = faults.tiny_dataset(root)
    cases = [
        *faults.checkpoint_cases(root, dataset, order),
        *faults.npz_cases(root),
        *faults.cifar_cases(root),
        *faults.hf_cases(root),
        *faults.stored_cases(root),
    ]
    return {(c.family, c.name): c for c in cases}


@pytest.mark.parametrize("key", FOUND + SAMPLE, ids=lambda k: f"{k[0]}: {k[1]}")
def test_a_bad_file_ends_in_an_error_naming_it(corpus, key):
    outcome = faults.classify(corpus[key])
    assert outcome.kind == "clear", f"{outcome.kind}: {outcome.message[-1500:]}"
    assert "Traceback" not in outcome.message


def test_config_keys_given_wrong_values_are_named(tmp_path):
    """Every 15th of the config corpus (wrong types, out-of-range values, unknown keys): each is
    refused before planning, naming its key."""
    cases = faults.config_cases(tmp_path)[::15]
    assert len(cases) > 20
    outcomes = [faults.classify(case) for case in cases]
    assert [(o.case.name, o.kind) for o in outcomes if o.kind != "clear"] == []
