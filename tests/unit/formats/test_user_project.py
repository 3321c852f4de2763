"""A run epochlens did not train: the test user project read back through epochlens.formats.

The project (tests/userproject) has its own ViT-like model, trained outside epochlens by a plain loop
(``ckpt_{step}.pt`` dicts) and by ``transformers.Trainer`` (``checkpoint-{step}/``), with its data as
an ImageFolder and as a ``save_to_disk`` folder. Everything read back must equal what was written.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from quality import SEED, above
from userproject import CLASSES, UserProject, build_user_project

from epochlens.errors import CheckpointError, DataError
from epochlens.formats.factory import FactoryError, FactorySpec, factory_fingerprint, factory_sources
from epochlens.formats.image_decode import ImageSettings
from epochlens.formats.images import load_image_folder, load_saved_dataset
from epochlens.formats.trainer_folders import list_trainer_checkpoints, step_epoch_table, trainer_step_epochs
from epochlens.formats.user_model import (
    attach_output_adapter,
    build_user_model,
    default_blocks,
    extract_logits,
)
from epochlens.formats.weights import fit_weights, load_weights, shapes_of


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> UserProject:
    return build_user_project(tmp_path_factory.mktemp("userproject"), seed=SEED)


def spec_of(project: UserProject, **changes) -> FactorySpec:
    return FactorySpec(
        factory=changes.get("factory", project.factory),
        kwargs=changes.get("kwargs", project.kwargs),
        project_path=changes.get("project_path", project.project_path),
    )


def settings_of(project: UserProject, **changes) -> ImageSettings:
    return ImageSettings(size=project.size, mean=project.mean, std=project.std, **changes)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_factory_builds_the_users_model(project: UserProject) -> None:
    spec = spec_of(project)
    rel = [p.relative_to(project.project_path).as_posix() for p in factory_sources(spec)]
    assert rel == ["tinyvit/__init__.py", "tinyvit/layers.py", "tinyvit/model.py"]
    model = build_user_model(spec, defaults={"num_classes": len(CLASSES), "in_channels": 3})
    assert type(model).__name__ == "TinyViT"
    assert Path(sys.modules[type(model).__module__].__file__).is_relative_to(project.project_path)
    assert default_blocks(model) == ["blocks.0", "blocks.1"]
    x = torch.zeros(2, 3, project.size, project.size)
    out = model(x)
    assert isinstance(out, dict) and extract_logits(out).shape == (2, len(CLASSES))
    attach_output_adapter(model)
    assert model(x).shape == (2, len(CLASSES))


@pytest.mark.quality
def test_loop_checkpoints_and_data_reproduce_the_users_predictions(project: UserProject) -> None:
    paths = sorted(project.loop_dir.glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    assert [int(p.stem.split("_")[1]) for p in paths] == sorted(project.loop_states)
    for path in paths:
        assert_same(load_weights(path), project.loop_states[int(path.stem.split("_")[1])])  # 'model' found
    model = build_user_model(spec_of(project))
    assert fit_weights(model, load_weights(paths[-1]), source=paths[-1]).ok
    model.eval()
    attach_output_adapter(model)
    data = load_image_folder(project.image_folder, settings_of(project))
    with torch.no_grad():
        logits = model(data.normalized("test"))
    # epochlens' reading of the user's data and weights gives the user's own predictions
    assert torch.allclose(logits, project.final_test_logits, atol=1e-5)
    accuracy = float((logits.argmax(1).numpy() == data.test_labels).mean())
    assert accuracy == project.final_test_accuracy
    above("the user's ViT: test accuracy (3 classes)", accuracy, 0.6)  # it learned


def test_trainer_folder_discovery_epochs_and_weights(project: UserProject) -> None:
    listed = list_trainer_checkpoints(project.trainer_dir)
    assert [s for s, _ in listed] == sorted(project.trainer_states) == [4, 8, 12]
    rows = trainer_step_epochs(project.trainer_dir)
    assert [r.epoch_source for r in rows] == ["trainer_state"] * 3
    assert [r.epoch for r in rows] == pytest.approx([s / project.steps_per_epoch for s in (4, 8, 12)])
    table = step_epoch_table(project.trainer_dir)
    assert table["epoch"].iloc[-1] == pytest.approx(2.0)
    for r in rows:
        assert r.weights.name == "model.safetensors"
        state = load_weights(r.path)
        assert_same(state, project.trainer_states[r.step])
        assert fit_weights(build_user_model(spec_of(project)), state, source=r.path).ok


def test_both_data_layouts_give_the_same_arrays(project: UserProject) -> None:
    folder = load_image_folder(project.image_folder, settings_of(project))
    saved = load_saved_dataset(project.saved_dataset, settings_of(project, group_column="source"))
    for attr in ("train_images", "train_labels", "test_images", "test_labels"):
        assert np.array_equal(getattr(folder, attr), getattr(saved, attr)), attr
    assert np.array_equal(folder.train_images, project.train_inputs)  # the user's resize, pixel for pixel
    assert np.array_equal(folder.test_labels, project.test_labels)
    assert folder.class_names == saved.class_names == CLASSES
    assert (folder.mean, folder.std) == (project.mean, project.std) == (saved.mean, saved.std)
    assert saved.group_names == ["clean", "noisy"]
    assert np.array_equal(saved.groups("test"), project.test_sources)
    assert folder.train_images.shape == (192, 3, 8, 8)


def test_bad_input_names_the_file_or_key_and_the_fix(project: UserProject, tmp_path: Path) -> None:
    with pytest.raises(FactoryError) as info:
        build_user_model(spec_of(project, factory="tinyvit.modle:build"))
    msg = str(info.value)
    assert "model.factory='tinyvit.modle:build'" in msg and str(project.project_path) in msg
    assert "no module 'tinyvit.modle'" in msg and "model.project_path" in msg

    path = project.loop_dir / "ckpt_0.pt"
    deeper = build_user_model(spec_of(project, kwargs={**project.kwargs, "depth": 3}))
    candidates = {"depth 2": shapes_of(build_user_model(spec_of(project))), "depth 3": shapes_of(deeper)}
    with pytest.raises(CheckpointError) as info:
        fit_weights(deeper, load_weights(path), source=path, candidates=candidates)
    msg = str(info.value)
    assert msg.startswith(f"{path}: the weights do not fit TinyViT (")
    assert "missing keys ['blocks.2.attn.proj.bias'" in msg and "look most like 'depth 2'" in msg
    lightning = tmp_path / "epoch=1-step=30.ckpt"
    torch.save({"state_dict": {"model." + k: v for k, v in project.loop_states[30].items()}}, lightning)
    with pytest.raises(CheckpointError, match=r"epoch=1-step=30.ckpt: .*checkpoints.strip_prefix: 'model.'"):
        fit_weights(build_user_model(spec_of(project)), load_weights(lightning), source=lightning)

    with pytest.raises(DataError) as info:
        load_saved_dataset(project.saved_dataset, settings_of(project, label_column="class"))
    msg = str(info.value)
    assert f"{project.saved_dataset} [train]: no column 'class' (data.images.label_column)" in msg
    assert "['image', 'label', 'source']" in msg

    with pytest.raises(CheckpointError) as info:
        list_trainer_checkpoints(project.loop_dir)
    msg = str(info.value)
    assert f"{project.loop_dir}: no checkpoint-{{step}}/ folders (found ['ckpt_0.pt'," in msg
    assert "output_dir of transformers.Trainer" in msg


def test_editing_the_users_model_changes_its_fingerprint(project: UserProject, tmp_path: Path) -> None:
    code = tmp_path / "code"
    shutil.copytree(project.project_path, code)
    spec = spec_of(project, project_path=code)
    before = factory_fingerprint(spec)
    (code / "tinyvit" / "notes.py").write_text("# not imported by the model\n")
    assert factory_fingerprint(spec) == before
    layers = code / "tinyvit" / "layers.py"
    layers.write_text(layers.read_text().replace("nn.GELU()", "nn.ReLU()"))
    assert factory_fingerprint(spec) != before
