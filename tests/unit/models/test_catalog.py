"""The torch-free catalog of the built-in models' module names equals the real models'."""

from __future__ import annotations

import pytest

from epochlens.models.catalog import DEFAULT_LAYERS, LAYERS, known_layers
from epochlens.models.layers import available_layers, default_layers
from epochlens.models.networks import MODELS, build_model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_catalog_equals_named_modules(name):
    for classes, channels in ((10, 1), (100, 3)):
        model = build_model(name, classes, channels)
        assert LAYERS[name] == available_layers(model)
        assert DEFAULT_LAYERS[name] == default_layers(model)


def test_every_builtin_model_is_catalogued():
    assert set(LAYERS) == set(MODELS) == set(DEFAULT_LAYERS)
    assert known_layers("someone_elses_vit") is None  # checked when its job builds it
