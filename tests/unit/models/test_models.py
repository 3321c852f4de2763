"""Architectures (state_dict compatible with the LoP ResNet-18) and logit restriction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from epochlens.models.networks import ResNet18LoP, SmallCNN, build_model, positions_in, restrict_logits

BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _conv(prefix, cout, cin, k):
    return [(f"{prefix}.weight", (cout, cin, k, k)), (f"{prefix}.bias", (cout,))]


def _bn(prefix, c):
    return [(f"{prefix}.{name}", () if name == "num_batches_tracked" else (c,)) for name in BN]


def _block(prefix, cin, cout, downsample):
    keys = _conv(f"{prefix}.conv1", cout, cin, 3) + _bn(f"{prefix}.bn1", cout)
    keys += _conv(f"{prefix}.conv2", cout, cout, 3) + _bn(f"{prefix}.bn2", cout)
    if downsample:
        keys += _conv(f"{prefix}.downsample.0", cout, cin, 1) + _bn(f"{prefix}.downsample.1", cout)
    return keys


# lop/nets/torchvision_modified_resnet.py, build_resnet18(num_classes=100): a biased 3x3 stem, no
# max-pool, BasicBlocks [2, 2, 2, 2] with biased convolutions, a 1x1-conv + BN downsample in the
# first block of layers 2-4 (stride 2, channels change), fc 512 -> 100. In registration order.
LOP_RESNET18_KEYS = (
    _conv("conv1", 64, 3, 3)
    + _bn("bn1", 64)
    + _block("layer1.0", 64, 64, downsample=False)
    + _block("layer1.1", 64, 64, downsample=False)
    + _block("layer2.0", 64, 128, downsample=True)
    + _block("layer2.1", 128, 128, downsample=False)
    + _block("layer3.0", 128, 256, downsample=True)
    + _block("layer3.1", 256, 256, downsample=False)
    + _block("layer4.0", 256, 512, downsample=True)
    + _block("layer4.1", 512, 512, downsample=False)
    + [("fc.weight", (100, 512)), ("fc.bias", (100,))]
)


def test_expected_key_list_is_what_the_architecture_says():
    # stem 2 + 5; 8 blocks x (2 + 5 + 2 + 5); 3 downsamples x (2 + 5); fc 2
    assert len(LOP_RESNET18_KEYS) == 7 + 8 * 14 + 3 * 7 + 2 == 142
    assert len({k for k, _ in LOP_RESNET18_KEYS}) == 142
    keys = dict(LOP_RESNET18_KEYS)
    assert keys["conv1.weight"] == (64, 3, 3, 3) and keys["conv1.bias"] == (64,)
    assert keys["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    assert keys["layer4.0.downsample.1.running_var"] == (512,)
    assert "layer1.0.downsample.0.weight" not in keys
    assert keys["fc.weight"] == (100, 512)


def test_resnet18_lop_state_dict_equals_the_original():
    state = ResNet18LoP(num_classes=100).state_dict()
    assert [(k, tuple(v.shape)) for k, v in state.items()] == LOP_RESNET18_KEYS
    assert state["bn1.num_batches_tracked"].dtype == torch.int64
    assert all(v.dtype == torch.float32 for k, v in state.items() if "num_batches" not in k)


def test_resnet18_lop_loads_a_state_dict_with_the_original_keys_strictly():
    torch.manual_seed(0)
    state = {
        k: (torch.tensor(3) if k.endswith("num_batches_tracked") else torch.randn(shape))
        for k, shape in LOP_RESNET18_KEYS
    }
    for k in state:
        if k.endswith("running_var"):
            state[k] = state[k].abs() + 0.5
    model = ResNet18LoP()
    model.load_state_dict(state, strict=True)
    loaded = model.state_dict()
    for k in ("fc.bias", "layer3.0.downsample.0.weight", "layer4.1.bn2.running_var"):
        torch.testing.assert_close(loaded[k], state[k])


def test_resnet18_lop_forward_shapes_and_resolutions():
    model = ResNet18LoP(num_classes=100).eval()
    sizes = {}
    for name in ("conv1", "layer1", "layer2", "layer3", "layer4"):
        getattr(model, name).register_forward_hook(
            lambda _m, _i, out, name=name: sizes.__setitem__(name, tuple(out.shape[1:]))
        )
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 100)
    # 3x3 stride-1 stem and no max-pool: layer1 still works at 32x32.
    assert sizes == {
        "conv1": (64, 32, 32),
        "layer1": (64, 32, 32),
        "layer2": (128, 16, 16),
        "layer3": (256, 8, 8),
        "layer4": (512, 4, 4),
    }
    with torch.no_grad():
        assert ResNet18LoP(num_classes=10).eval()(torch.randn(2, 3, 32, 32)).shape == (2, 10)
        model = ResNet18LoP(num_classes=7, in_channels=1).eval()
        assert model(torch.randn(2, 1, 16, 16)).shape == (2, 7)


def _reference_forward(state, x):
    """The forward pass of the original ResNet-18 in eval mode, written with functional ops."""

    def conv(prefix, x, stride, padding):
        return F.conv2d(x, state[f"{prefix}.weight"], state[f"{prefix}.bias"], stride, padding)

    def bn(prefix, x):
        return F.batch_norm(
            x,
            state[f"{prefix}.running_mean"],
            state[f"{prefix}.running_var"],
            state[f"{prefix}.weight"],
            state[f"{prefix}.bias"],
            training=False,
            eps=1e-5,
        )

    x = F.relu(bn("bn1", conv("conv1", x, 1, 1)))
    for layer, stride in zip((1, 2, 3, 4), (1, 2, 2, 2), strict=True):
        for block in (0, 1):
            p = f"layer{layer}.{block}"
            s = stride if block == 0 else 1
            out = F.relu(bn(f"{p}.bn1", conv(f"{p}.conv1", x, s, 1)))
            out = bn(f"{p}.bn2", conv(f"{p}.conv2", out, 1, 1))
            if f"{p}.downsample.0.weight" in state:
                identity = bn(f"{p}.downsample.1", conv(f"{p}.downsample.0", x, s, 0))
            else:
                identity = x
            x = F.relu(out + identity)
    x = x.mean(dim=(2, 3))
    return F.linear(x, state["fc.weight"], state["fc.bias"])


def test_resnet18_lop_forward_equals_the_original_wiring():
    torch.manual_seed(0)
    model = ResNet18LoP(num_classes=100)
    with torch.no_grad():  # non-trivial BN statistics and biases
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            elif isinstance(m, torch.nn.Conv2d | torch.nn.Linear):
                m.bias.uniform_(-0.1, 0.1)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = _reference_forward(model.state_dict(), x)
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)


def test_resnet18_lop_initialisation():
    torch.manual_seed(0)
    model = ResNet18LoP()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Conv2d):
            assert torch.count_nonzero(m.bias) == 0, name
        if isinstance(m, torch.nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0), name
    assert torch.count_nonzero(model.fc.bias) == 0
    # kaiming normal: std sqrt(2 / fan_in) for the ReLU convolutions, sqrt(1 / fan_in) for fc
    w = model.layer4[1].conv2.weight
    assert w.std().item() == pytest.approx((2 / (512 * 9)) ** 0.5, rel=0.02)
    assert model.fc.weight.std().item() == pytest.approx((1 / 512) ** 0.5, rel=0.05)


# ---------------------------------------------------------------- SmallCNN, build_model


def test_small_cnn_shapes():
    model = SmallCNN(num_classes=10).eval()
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["block1.0.weight"] == (16, 1, 3, 3)
    assert "block1.0.bias" not in shapes  # bias-free convolutions before BatchNorm
    assert shapes["block3.0.weight"] == (64, 32, 3, 3)
    assert shapes["fc.weight"] == (10, 64)
    assert SmallCNN(num_classes=4, in_channels=3)(torch.randn(3, 3, 8, 8)).shape == (3, 4)


def test_small_cnn_trains_with_batch_of_two():
    model = SmallCNN(num_classes=3)
    out = model(torch.randn(2, 1, 8, 8))
    F.cross_entropy(out, torch.tensor([0, 2])).backward()
    assert model.block1[0].weight.grad is not None


def test_build_model():
    m = build_model("small_cnn", num_classes=10, in_channels=1)
    assert isinstance(m, SmallCNN) and m.fc.out_features == 10
    m = build_model("resnet18_lop", num_classes=100, in_channels=3)
    assert isinstance(m, ResNet18LoP) and m.fc.out_features == 100
    assert m.conv1.in_channels == 3
    with pytest.raises(ValueError, match=r"unknown model 'resnet50'.*resnet18_lop"):
        build_model("resnet50", num_classes=10, in_channels=3)


# ---------------------------------------------------------------- logit restriction


def test_restrict_logits_selects_columns_in_class_order():
    logits = torch.arange(20.0).view(2, 10)
    active = np.array([7, 2, 5])
    out = restrict_logits(logits, active)
    torch.testing.assert_close(out, torch.tensor([[7.0, 2.0, 5.0], [17.0, 12.0, 15.0]]))
    torch.testing.assert_close(restrict_logits(logits, torch.tensor([7, 2, 5])), out)
    assert restrict_logits(logits, np.array([], dtype=np.int64)).shape == (2, 0)


def test_restrict_logits_takes_an_index_tensor_on_a_device_numpy_cannot_read():
    # The curvature engine keeps the active classes on the compute device; a CUDA tensor refuses
    # NumPy conversion exactly as a meta tensor does, so this is the GPU path without a GPU.
    logits = torch.empty(3, 10, device="meta")
    out = restrict_logits(logits, torch.tensor([7, 2], device="meta"))
    assert out.shape == (3, 2) and out.device.type == "meta"


def test_restrict_logits_gradient_reaches_only_active_columns():
    logits = torch.randn(3, 6, requires_grad=True)
    restrict_logits(logits, np.array([4, 1])).sum().backward()
    expected = torch.zeros(3, 6)
    expected[:, [4, 1]] = 1
    torch.testing.assert_close(logits.grad, expected)


def test_positions_in():
    active = np.array([7, 2, 5])
    labels = np.array([7, 2, 5, 7, 3, 0, 9])
    pos = positions_in(labels, active)
    assert pos.dtype == np.int64
    np.testing.assert_array_equal(pos, [0, 1, 2, 0, -1, -1, -1])
    assert positions_in(np.array([], dtype=np.int64), active).shape == (0,)


def test_restricted_cross_entropy_matches_the_lop_training_loss():
    """LoP: loss(net(x)[:, all_classes[:n]], one-hot target in that order)."""
    torch.manual_seed(0)
    order = np.random.default_rng(0).permutation(10)
    active = order[:4]
    labels = active[[0, 3, 1, 1, 2]]
    logits = torch.randn(5, 10)
    restricted = restrict_logits(logits, active)
    target = torch.from_numpy(positions_in(labels, active))
    # The restricted logit at the target position is the logit of the true class.
    torch.testing.assert_close(restricted[torch.arange(5), target], logits[torch.arange(5), labels])
    one_hot = F.one_hot(target, 4).float()
    torch.testing.assert_close(
        F.cross_entropy(restricted, target), F.cross_entropy(logits[:, active], one_hot)
    )


def test_build_model_with_a_seed_is_reproducible_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("small_cnn", 10, 1, seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_model("small_cnn", 10, 1, seed=7)
    c = build_model("small_cnn", 10, 1, seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.state_dict()["fc.weight"], c.state_dict()["fc.weight"])


def test_checkpoint_bytes_depend_only_on_the_weights(tmp_path):
    from epochlens.checkpoints import save_state_dict

    model = build_model("small_cnn", 10, 1, seed=0)
    save_state_dict(model, tmp_path / "a.pt")
    save_state_dict(model, tmp_path / "b.pt")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
