"""The user's model: factory specs, source tracking, import errors, logits adapter, default blocks."""

from __future__ import annotations

import sys
import textwrap
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from epochlens.formats.factory import (
    FactoryError,
    FactorySpec,
    factory_fingerprint,
    factory_sources,
    import_factory,
)
from epochlens.formats.user_model import (
    BlockError,
    OutputError,
    attach_output_adapter,
    build_user_model,
    default_blocks,
    extract_logits,
)
from epochlens.models import SmallCNN


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


PROJECT = {
    "mynet/__init__.py": '"""A user package."""\n',
    "mynet/model.py": """
        import torch
        from torch import nn

        import helpers
        from mynet import utils
        from .layers import Block


        def build(num_classes: int = 3, width: int = 4):
            return nn.Sequential(Block(width), nn.Flatten(), nn.Linear(width, num_classes))


        def build_kw(**kwargs):
            return nn.Linear(2, kwargs.get("num_classes", 1))


        def not_a_module():
            return (nn.Linear(2, 2), "transforms")


        def broken(width: int = 2):
            raise ValueError("width must be even")


        NUMBER = 3
    """,
    "mynet/layers.py": """
        from torch import nn

        from . import init_utils


        class Block(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, width)

            def forward(self, x):
                return self.fc(x)
    """,
    # beyond the top level (never run): the walk skips it
    "mynet/init_utils.py": "def later():\n    from ..helpers import nothing\n",
    "mynet/utils.py": "SCALE = 1\n",
    "mynet/unused.py": "import mynet.model\n",
    "helpers.py": "import os\n",
    "needs_missing.py": "import not_a_real_package_xyz\n\ndef build():\n    pass\n",
    "bad_syntax.py": "def build(:\n    pass\n",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    write(root, PROJECT)
    yield root
    for name in [n for n in sys.modules if n.split(".")[0] in ("mynet", "helpers")]:
        del sys.modules[name]
    if str(root) in sys.path:
        sys.path.remove(str(root))


def test_spec_parsing_and_bad_strings() -> None:
    spec = FactorySpec.from_config({"factory": " a.b.c:Net.build ", "kwargs": None, "project_path": "~/x"})
    assert (spec.module_name, spec.attribute, spec.kwargs) == ("a.b.c", "Net.build", {})
    assert spec.project_path == Path("~/x").expanduser()
    for bad in ("a.b", "a.b:", ":f", "a b:f", "a.b:f:g", 3):
        with pytest.raises(FactoryError, match="model.factory=.*package.module:function"):
            FactorySpec(factory=bad)
    with pytest.raises(FactoryError, match="model.kwargs must be a mapping"):
        FactorySpec(factory="a:b", kwargs=[1, 2])


def test_sources_follow_project_imports_without_importing(project: Path) -> None:
    spec = FactorySpec("mynet.model:build", project_path=project)
    sources = factory_sources(spec)
    rel = sorted(p.relative_to(project).as_posix() for p in sources)
    # model imports layers (relative), utils (absolute from the package), helpers (top level);
    # layers imports init_utils; unused.py is imported by nobody; torch is not the user's.
    assert rel == [
        "helpers.py",
        "mynet/__init__.py",
        "mynet/init_utils.py",
        "mynet/layers.py",
        "mynet/model.py",
        "mynet/utils.py",
    ]
    assert all(p.is_absolute() for p in sources)
    assert "mynet" not in sys.modules and "helpers" not in sys.modules
    assert factory_sources(FactorySpec("mynet.model:build")) == []  # installed package: not tracked


def test_fingerprint_follows_used_sources_only(project: Path) -> None:
    spec = FactorySpec("mynet.model:build", kwargs={"width": 4}, project_path=project)
    before = factory_fingerprint(spec)
    (project / "mynet/unused.py").write_text("# edited\n")
    assert factory_fingerprint(spec) == before
    (project / "mynet/layers.py").write_text((project / "mynet/layers.py").read_text() + "\n# edited\n")
    after = factory_fingerprint(spec)
    assert after != before
    assert (
        factory_fingerprint(FactorySpec("mynet.model:build", kwargs={"width": 6}, project_path=project))
        != after
    )


def test_build_passes_kwargs_and_only_accepted_defaults(project: Path) -> None:
    spec = FactorySpec("mynet.model:build", kwargs={"width": 5}, project_path=project)
    net = build_user_model(spec, defaults={"num_classes": 7, "in_channels": 3})
    assert isinstance(net, nn.Sequential)
    assert net[0].fc.in_features == 5 and net[2].out_features == 7
    # the config wins over the pipeline's defaults; **kwargs accepts every default
    net = build_user_model(
        FactorySpec("mynet.model:build", kwargs={"num_classes": 2}, project_path=project), {"num_classes": 7}
    )
    assert net[2].out_features == 2
    net = build_user_model(FactorySpec("mynet.model:build_kw", project_path=project), {"num_classes": 9})
    assert net.out_features == 9


def test_factory_errors_name_the_factory_the_path_and_the_fix(project: Path, tmp_path: Path) -> None:
    def err(factory: str, path: Path | None = project, **kw) -> str:
        with pytest.raises(FactoryError) as info:
            build_user_model(FactorySpec(factory, project_path=path, **kw))
        return str(info.value)

    msg = err("nonet.model:build")
    assert "'nonet.model:build'" in msg and "no module 'nonet'" in msg and str(project) in msg
    assert "model.project_path" in msg
    msg = err("mynet.nomodule:build")
    assert "no module 'mynet.nomodule'" in msg and "mynet/nomodule.py" in msg
    msg = err("mynet.model:biuld")
    assert "has no attribute 'biuld'" in msg and "'build'" in msg and "model.py" in msg
    assert "is a int, not a callable" in err("mynet.model:NUMBER")
    msg = err("mynet.model:not_a_module")
    assert "returned a tuple, not a torch.nn.Module" in msg and "return the module itself" in msg
    msg = err("mynet.model:build", kwargs={"depth": 3})
    assert "model.kwargs {'depth': 3} do not fit mynet.model:build(num_classes" in msg
    msg = err("mynet.model:broken")
    assert "raised ValueError: width must be even" in msg
    msg = err("needs_missing:build")
    assert "imports 'not_a_real_package_xyz', which is not installed" in msg and "needs_missing.py:1" in msg
    msg = err("bad_syntax:build")
    assert "bad_syntax.py:1: syntax error" in msg
    with pytest.raises(FactoryError, match=r"bad_syntax.py:1: syntax error"):
        factory_sources(FactorySpec("bad_syntax:build", project_path=project))
    msg = err("mynet.model:build", path=tmp_path / "nowhere")
    assert "model.project_path=" in msg and "no such folder" in msg
    with pytest.raises(FactoryError, match="no module 'nonet.model'.*model.project_path"):
        factory_sources(FactorySpec("nonet.model:build", project_path=project))


def test_same_package_name_in_two_projects(tmp_path: Path) -> None:
    """A second project with the same package name is imported from its own folder."""
    roots = []
    for width in (3, 5):
        root = tmp_path / f"p{width}"
        write(
            root,
            {
                "samename/__init__.py": "",
                "samename/m.py": f"from torch import nn\nW = {width}\n"
                "def build():\n    return nn.Linear(W, 1)\n",
            },
        )
        roots.append(root)
    try:
        widths = [
            build_user_model(FactorySpec("samename.m:build", project_path=r)).in_features for r in roots
        ]
        assert widths == [3, 5]
        # an unrelated installed package of another name is never forgotten
        assert import_factory(FactorySpec("torch.nn:Linear", project_path=roots[0])) is nn.Linear
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "samename"]:
            del sys.modules[name]
        for r in roots:
            if str(r) in sys.path:
                sys.path.remove(str(r))


# ---------------------------------------------------------------------------------------------
# Logits


@dataclass
class _Out:
    loss: torch.Tensor | None
    scores: torch.Tensor


def test_extract_logits_from_every_output_kind() -> None:
    from transformers.modeling_outputs import SequenceClassifierOutput

    z = torch.arange(6.0).view(2, 3)
    assert extract_logits(z) is z
    assert extract_logits({"loss": torch.tensor(1.0), "logits": z}) is z
    assert extract_logits(SequenceClassifierOutput(loss=None, logits=z)) is z
    assert extract_logits(SequenceClassifierOutput(loss=torch.tensor(0.5), logits=z)) is z
    assert extract_logits((z, torch.zeros(2))) is z
    assert extract_logits(_Out(None, z), field="scores") is z
    assert extract_logits({"out": z}, field="out") is z
    Named = namedtuple("Named", "hidden logits")
    assert extract_logits(Named(torch.zeros(1), z)) is z
    with pytest.raises(OutputError, match=r"no 'logits'.*\{loss: NoneType, scores: Tensor\}.*model.output"):
        extract_logits(_Out(None, z), field="logits")
    with pytest.raises(OutputError, match=r"cannot find the logits.*\{loss: NoneType, scores: Tensor\}"):
        extract_logits(_Out(None, z))
    with pytest.raises(OutputError, match=r"\{out: Tensor\}.*set model.output"):
        extract_logits({"out": z})
    with pytest.raises(OutputError, match="model.output='loss' is a NoneType, not a tensor"):
        extract_logits(_Out(None, z), field="loss")


class _DictNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.fc(x)
        return {"logits": logits, "hidden": x}


def test_output_adapter_keeps_names_and_keys() -> None:
    net = _DictNet()
    keys = list(net.state_dict())
    x = torch.randn(5, 4)
    handle = attach_output_adapter(net)
    out = net(x)
    assert isinstance(out, torch.Tensor) and torch.equal(out, net.fc(x))
    assert list(net.state_dict()) == keys and [n for n, _ in net.named_modules()] == ["", "fc"]
    handle.remove()
    assert isinstance(net(x), dict)
    attach_output_adapter(net, field="hidden")
    assert torch.equal(net(x), x)


# ---------------------------------------------------------------------------------------------
# Default blocks on structurally different models


class _Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride), nn.BatchNorm2d(cout)) if stride > 1 else None
        )


class _TorchvisionResNet(nn.Module):
    """torchvision's layout: stem, layer1..layer3 (Sequentials of blocks), fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
        self.layer1 = nn.Sequential(_Basic(4, 4), _Basic(4, 4))
        self.layer2 = nn.Sequential(_Basic(4, 8, 2), _Basic(8, 8))
        self.layer3 = nn.Sequential(_Basic(8, 8, 2), _Basic(8, 8), _Basic(8, 8))
        self.fc = nn.Linear(8, 10)


class _Attention(nn.Module):
    def __init__(self, dim: int, per_head: bool = False) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        # a per-head module list (composite heads) must not be mistaken for the blocks
        self.heads = nn.ModuleList(_Head(dim) for _ in range(2)) if per_head else None


class _Head(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(dim, 2), nn.Linear(dim, 2)


class _ViTBlock(nn.Module):
    def __init__(self, dim: int, per_head: bool = False) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), _Attention(dim, per_head)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))


class _TimmViT(nn.Module):
    def __init__(self, per_head: bool = False) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 8, 4, 4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.blocks = nn.Sequential(*(_ViTBlock(8, per_head) for _ in range(3)))
        self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 10)


class _ConvNeXtStage(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.downsample = nn.Conv2d(dim, dim, 2, 2)
        self.blocks = nn.Sequential(*(_Basic(dim, dim) for _ in range(2)))


class _ConvNeXt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, 4)
        self.stages = nn.Sequential(*(_ConvNeXtStage(8) for _ in range(3)))
        self.head = nn.Linear(8, 10)


class _Hybrid(nn.Module):
    """Conv stages of residual blocks, then transformer blocks: both groups, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([_Basic(3, 3), _Basic(3, 3)])
        self.blocks = nn.ModuleList([_ViTBlock(3), _ViTBlock(3), _ViTBlock(3)])
        self.head = nn.Linear(3, 2)


def test_default_blocks_of_common_families() -> None:
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, T5Config, T5EncoderModel

    resnet = default_blocks(_TorchvisionResNet())
    assert resnet == ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer3.2"]
    assert default_blocks(_TimmViT()) == ["blocks.0", "blocks.1", "blocks.2"]
    assert default_blocks(_TimmViT(per_head=True)) == ["blocks.0", "blocks.1", "blocks.2"]
    assert default_blocks(_ConvNeXt()) == [f"stages.{i}.blocks.{j}" for i in range(3) for j in range(2)]
    assert default_blocks(_Hybrid()) == ["convs.0", "convs.1", "blocks.0", "blocks.1", "blocks.2"]

    small = {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 30}
    bert = BertModel(BertConfig(num_hidden_layers=3, **small))
    assert default_blocks(bert) == ["encoder.layer.0", "encoder.layer.1", "encoder.layer.2"]
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=2, n_head=2, vocab_size=30, n_positions=16))
    assert default_blocks(gpt2) == ["transformer.h.0", "transformer.h.1"]
    t5 = T5EncoderModel(T5Config(d_model=8, d_kv=4, d_ff=16, num_layers=2, num_heads=2, vocab_size=30))
    assert default_blocks(t5) == ["encoder.block.0", "encoder.block.1"]


def test_default_blocks_fallbacks() -> None:
    flat = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3),
        nn.ReLU(),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.LazyLinear(2),
    )
    assert default_blocks(flat) == ["0", "2"]  # the repeated convolutions
    assert default_blocks(SmallCNN(10)) == ["block1", "block2", "block3"]  # children but the head
    with pytest.raises(BlockError, match="name them in the config"):
        default_blocks(nn.Sequential(nn.ReLU(), nn.Flatten()))
