"""Unit tests of feature extraction, representations and the per-epoch feature cache."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from epochlens.data import Dataset
from epochlens.errors import ConfigError, EpochlensError, FeatureError, LayerError
from epochlens.features.cache import FeatureSet, load_or_extract
from epochlens.features.extract import extract_features
from epochlens.features.representations import STATS_COLUMNS, pooled, simple_stats
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.features.spectral import randomized_svdvals, sketch_matrix, spectral, spectral_method_for
from epochlens.models.layers import default_layers, resolve_layers
from epochlens.models.networks import ResNet18LoP, SmallCNN

CKPT = "a" * 64  # stand-ins for checkpoint file hashes
OTHER_CKPT = "b" * 64


@pytest.fixture
def digits_like(rng: np.random.Generator) -> Dataset:
    """40 train / 12 test 1x8x8 images of 4 classes (values 0..16, like sklearn's digits)."""
    return Dataset(
        name="digits_like",
        source="test",
        train_images=rng.integers(0, 17, size=(40, 1, 8, 8), dtype=np.uint8),
        train_labels=np.tile(np.arange(4), 10),
        test_images=rng.integers(0, 17, size=(12, 1, 8, 8), dtype=np.uint8),
        test_labels=np.tile(np.arange(4), 3),
        num_classes=4,
        scale=1 / 16,
        mean=(0.3,),
        std=(0.4,),
    )


@pytest.fixture
def cnn() -> SmallCNN:
    torch.manual_seed(0)
    model = SmallCNN(num_classes=4, in_channels=1)
    for m in model.modules():  # non-trivial BatchNorm statistics, as after training
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


class CountingCNN(SmallCNN):
    """SmallCNN that counts its forward calls."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return super().forward(x)


# --- layer specs ---------------------------------------------------------------------------


def test_default_layers_are_block_outputs() -> None:
    assert default_layers(SmallCNN(10, 1)) == ["block1", "block2", "block3"]
    assert default_layers(ResNet18LoP(10)) == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    generic = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
    assert default_layers(generic) == ["0"]


def test_unknown_layer_lists_available_ones(cnn: SmallCNN) -> None:
    with pytest.raises(LayerError, match=r"no layer\(s\) \['block9'\].*'block1.0'") as err:
        resolve_layers(cnn, ["block1", "block9"])
    assert isinstance(err.value, EpochlensError)
    assert "Default (block outputs): ['block1', 'block2', 'block3']" in str(err.value)


def test_module_run_twice_is_refused() -> None:
    net = ResNet18LoP(4)
    with pytest.raises(LayerError, match=r"'layer1.0.relu' ran 2 times"):
        extract_features(net, torch.randn(2, 3, 8, 8), layers=["layer1.0.relu"])


# --- representations -----------------------------------------------------------------------


def test_representations_match_definitions() -> None:
    act = torch.randn(3, 5, 4, 6, generator=torch.Generator().manual_seed(0)).double()
    assert torch.allclose(pooled(act), act.mean((2, 3)))
    stats = simple_stats(act)
    assert stats.shape == (3, len(STATS_COLUMNS))
    flat = act.flatten(1).numpy()
    expected = np.stack(
        [
            flat.mean(1),
            flat.std(1),
            flat.min(1),
            flat.max(1),
            np.sqrt((flat**2).mean(1)),
            (flat > 0).mean(1),
        ],
        1,
    )
    np.testing.assert_allclose(stats.numpy(), expected, rtol=1e-12)
    ref = np.linalg.svd(act.flatten(2).numpy(), compute_uv=False)
    for method in ("auto", "gram", "exact", "randomized"):  # randomized: the sketch spans all 5 rows
        settings = RepresentationSettings(spectral_k=7, spectral_method=method)
        sv = spectral(act, settings).numpy()  # 5 x 24 matrices have 5 singular values; 2 zeros follow
        np.testing.assert_allclose(sv[:, :5], ref, rtol=1e-10)
        assert (sv[:, 5:] == 0).all()
    exact = RepresentationSettings(spectral_k=7, spectral_method="exact")
    # A (B, D) activation is a 1 x D matrix: its singular value is the norm.
    vec = torch.randn(4, 10, dtype=torch.float64)
    np.testing.assert_allclose(spectral(vec, exact)[:, 0].numpy(), vec.norm(dim=1).numpy())


def test_auto_spectral_method_and_gram_accuracy() -> None:
    auto = RepresentationSettings()
    assert spectral_method_for((64, 32, 32), auto) == "gram"  # min side 64
    assert spectral_method_for((512, 4, 4), auto) == "gram"
    assert spectral_method_for((256, 56, 56), auto) == "randomized"
    act = torch.relu(torch.randn(4, 32, 16, 16, generator=torch.Generator().manual_seed(3)))
    gram = spectral(act, RepresentationSettings(spectral_method="gram"))
    exact = spectral(act, RepresentationSettings(spectral_method="exact"))
    assert gram.dtype == torch.float32
    torch.testing.assert_close(gram, exact, rtol=0, atol=1e-6 * float(exact.max()))


def test_randomized_svd_is_exact_for_low_rank_and_batch_invariant() -> None:
    gen = torch.Generator().manual_seed(1)
    low_rank = torch.randn(6, 40, 5, generator=gen, dtype=torch.float64) @ torch.randn(
        6, 5, 300, generator=gen, dtype=torch.float64
    )  # rank 5 < q: the sketch captures the whole range
    omega = sketch_matrix(300, 12, seed=0, dtype=torch.float64, device=torch.device("cpu"))
    approx = randomized_svdvals(low_rank, 4, omega, n_iter=1)
    np.testing.assert_allclose(approx.numpy(), torch.linalg.svdvals(low_rank)[:, :4].numpy(), rtol=1e-9)
    settings = RepresentationSettings(spectral_k=3, spectral_method="randomized", spectral_oversample=4)
    act = torch.randn(5, 16, 10, 10, generator=gen)
    whole = spectral(act, settings)
    parts = torch.cat([spectral(act[:2], settings), spectral(act[2:], settings)])
    torch.testing.assert_close(whole, parts, rtol=1e-5, atol=1e-6)


def test_representation_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown representations"):
        RepresentationSettings(names=("pooled", "svd"))
    with pytest.raises(ConfigError, match="dtype"):
        FeatureSettings(dtype="float64")


# --- extraction ----------------------------------------------------------------------------


def test_features_do_not_depend_on_batch_size(cnn: SmallCNN, digits_like: Dataset) -> None:
    x = digits_like.normalized("train")
    a = extract_features(cnn, x, batch_size=40)
    b = extract_features(cnn, x, batch_size=7)
    assert list(a) == ["block1", "block2", "block3"]
    for layer in a:
        for rep in ("pooled", "stats", "spectral"):
            np.testing.assert_allclose(a[layer][rep], b[layer][rep], rtol=1e-5, atol=1e-6)
    # Pooled block3 features are what fc sees: the hooks record the real block outputs.
    with torch.no_grad():
        logits = cnn(x)
    np.testing.assert_allclose(
        a["block3"]["pooled"] @ cnn.fc.weight.detach().numpy().T + cnn.fc.bias.detach().numpy(),
        logits.numpy(),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_file_layout_shapes_dtype_and_attrs(tmp_path, cnn, digits_like, dtype) -> None:
    path = tmp_path / "features" / "epoch_0003.h5"
    settings = FeatureSettings(dtype=dtype, batch_size=16, representations={"spectral_k": 4})
    result = load_or_extract(path, cnn, digits_like, CKPT, settings)
    assert not result.hit and result.reason == "no cached file"
    fs = result.features
    assert fs.layers == ["block1", "block2", "block3"] and fs.splits == ["train", "test"]
    widths = {"block1": 16, "block2": 32, "block3": 64}
    with h5py.File(path, "r") as f:
        assert f.attrs["checkpoint_sha256"] == CKPT
        assert json.loads(f.attrs["spec"])["dtype"] == dtype
        assert f.attrs["data_content_hash"] == digits_like.content_hash
        for split, n in (("train", 40), ("test", 12)):
            np.testing.assert_array_equal(f[f"{split}/labels"][()], digits_like.labels(split))
            for layer, c in widths.items():
                for rep, d in (("pooled", c), ("stats", 6), ("spectral", 4)):
                    ds = f[f"{split}/{layer}/{rep}"]
                    assert ds.shape == (n, d) and ds.dtype == np.dtype(dtype)
                    assert ds.chunks is not None and ds.compression == "gzip"
        assert tuple(f["train/block2/pooled"].attrs["activation_shape"]) == (32, 4, 4)
    assert fs.shape("block3") == (64, 2, 2)
    expected = extract_features(cnn, digits_like.normalized("test"), settings=settings.representations)
    tol = 1e-3 if dtype == "float16" else 1e-6
    for layer in widths:
        for rep in ("pooled", "stats", "spectral"):
            stored = fs.array("test", layer, rep)
            assert stored.dtype == np.float32 and fs.array("test", layer, rep, dtype=None).dtype == dtype
            np.testing.assert_allclose(stored, expected[layer][rep], rtol=tol, atol=tol)
    assert not list(path.parent.glob(".*.tmp"))  # the atomic writer left no temporary file


# --- cache behaviour -----------------------------------------------------------------------


def test_second_run_loads_without_recomputing(tmp_path, digits_like) -> None:
    path = tmp_path / "epoch_0001.h5"
    built = []

    def factory() -> SmallCNN:  # loading the checkpoint: must not happen on a hit
        built.append(1)
        torch.manual_seed(0)
        return CountingCNN(4, 1)

    settings = FeatureSettings(batch_size=16)
    CountingCNN.calls = 0
    first = load_or_extract(path, factory, digits_like, CKPT, settings)
    assert not first.hit and len(built) == 1 and CountingCNN.calls == 3 + 1  # 3 train + 1 test batches
    mtime = path.stat().st_mtime_ns
    before = first.features.load_all()

    calls = CountingCNN.calls
    second = load_or_extract(path, factory, digits_like, CKPT, settings)
    assert second.hit and second.reason == "cache hit"
    assert len(built) == 1 and CountingCNN.calls == calls and path.stat().st_mtime_ns == mtime
    after = second.features.load_all()
    for layer, by_rep in before["train"].items():
        for rep, arr in by_rep.items():
            np.testing.assert_array_equal(arr, after["train"][layer][rep])
    # Batch size and compression are not part of the key.
    again = FeatureSettings(batch_size=5, compression="lzf")
    assert load_or_extract(path, factory, digits_like, CKPT, again).hit


def test_changed_checkpoint_or_layer_spec_rebuilds(tmp_path, cnn, digits_like) -> None:
    path = tmp_path / "epoch_0002.h5"
    assert not load_or_extract(path, cnn, digits_like, CKPT).hit

    changed_ckpt = load_or_extract(path, cnn, digits_like, OTHER_CKPT)
    assert not changed_ckpt.hit and changed_ckpt.reason == "checkpoint changed"
    assert changed_ckpt.features.attrs["checkpoint_sha256"] == OTHER_CKPT

    layers = FeatureSettings(layers=["block2", "fc"])
    changed_layers = load_or_extract(path, cnn, digits_like, OTHER_CKPT, layers)
    assert not changed_layers.hit and changed_layers.reason == "spec changed (layers)"
    assert changed_layers.features.layers == ["block2", "fc"]
    assert changed_layers.features.array("train", "fc", "pooled").shape == (40, 4)
    assert load_or_extract(path, cnn, digits_like, OTHER_CKPT, layers).hit

    spectral_only = FeatureSettings(layers=["block2", "fc"], representations={"names": ["spectral"]})
    changed_rep = load_or_extract(path, cnn, digits_like, OTHER_CKPT, spectral_only)
    assert not changed_rep.hit and "representations" in changed_rep.reason
    assert changed_rep.features.representations == ["spectral"]

    renormalised = Dataset(**{**digits_like.__dict__, "mean": (0.1,)})
    changed_data = load_or_extract(path, cnn, renormalised, OTHER_CKPT, spectral_only)
    assert not changed_data.hit and changed_data.reason == "data changed"


def test_truncated_cache_file_is_rebuilt_and_reported(tmp_path, cnn, digits_like) -> None:
    path = tmp_path / "epoch_0004.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n garbage from a killed copy")
    result = load_or_extract(path, cnn, digits_like, CKPT)
    assert not result.hit and result.reason.startswith("cached file unreadable")
    assert result.features.layers == ["block1", "block2", "block3"]
    path.write_bytes(b"not hdf5")
    with pytest.raises(FeatureError, match=r"epoch_0004.h5: not a complete epochlens features file"):
        FeatureSet(path)


def test_failed_extraction_leaves_no_file(tmp_path, cnn, digits_like) -> None:
    huge = SmallCNN(4, 1)
    huge.load_state_dict(cnn.state_dict())
    with torch.no_grad():
        huge.block1[1].bias.fill_(1e5)  # activations beyond float16's range
    path = tmp_path / "epoch_0005.h5"
    with pytest.raises(FeatureError, match=r"layer 'block1' .* float16 range.*float32"):
        load_or_extract(path, huge, digits_like, CKPT, FeatureSettings(dtype="float16"))
    assert not path.exists() and not list(tmp_path.iterdir())
