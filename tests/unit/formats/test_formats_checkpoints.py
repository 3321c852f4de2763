"""Checkpoint layouts: dicts with a key, safetensors, sharded indexes, Trainer folders; key diagnosis."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from epochlens.config import validate
from epochlens.errors import CheckpointError
from epochlens.formats.trainer_folders import (
    insert_training_epochs,
    list_trainer_checkpoints,
    step_epoch_table,
    trainer_step_epochs,
    weights_file,
)
from epochlens.formats.weights import compare_keys, fit_weights, load_weights, shapes_of, suggest_prefix


class Net(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, width), nn.BatchNorm1d(width), nn.ReLU())
        self.head = nn.Linear(width, 2)


@pytest.fixture
def state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = Net()
    net.body[1].running_mean.add_(1.5)
    return {k: v.clone() for k, v in net.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(sorted(a)) == list(sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_dicts_with_keys(tmp_path: Path, state: dict) -> None:
    opt = torch.optim.Adam(Net().parameters())
    torch.save(state, tmp_path / "bare.pt")
    torch.save({"model": state, "optimizer": opt.state_dict(), "step": 7}, tmp_path / "ckpt_7.pt")
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "sd.pth")
    torch.save({"ema": {"model": state}, "net": state, "step": 1}, tmp_path / "nested.pt")
    torch.save(
        {"model." + k: v for k, v in state.items()} | {"loss.weight": torch.ones(1)}, tmp_path / "flat.pt"
    )
    assert_same(load_weights(tmp_path / "bare.pt"), state)
    assert_same(load_weights(tmp_path / "ckpt_7.pt"), state)  # 'model' found automatically
    assert_same(load_weights(tmp_path / "sd.pth"), state)
    assert_same(load_weights(tmp_path / "nested.pt", key="ema.model"), state)
    assert_same(load_weights(tmp_path / "nested.pt", key="net"), state)
    assert_same(load_weights(tmp_path / "flat.pt", key="model"), state)  # a prefix of a flat file

    with pytest.raises(CheckpointError) as info:
        load_weights(tmp_path / "nested.pt")
    msg = str(info.value)
    assert "nested.pt" in msg and "'ema': dict" in msg and "'net': dict" in msg and "checkpoints.key" in msg
    with pytest.raises(CheckpointError, match=r"checkpoints.key='weights' not found.*'model': dict"):
        load_weights(tmp_path / "ckpt_7.pt", key="weights")
    with pytest.raises(CheckpointError, match=r"checkpoints.key='step' not found"):
        load_weights(tmp_path / "ckpt_7.pt", key="step")


def test_safetensors_and_sharded(tmp_path: Path, state: dict) -> None:
    save_file(state, tmp_path / "model.safetensors")
    assert_same(load_weights(tmp_path / "model.safetensors"), state)
    save_file({"net." + k: v for k, v in state.items()}, tmp_path / "prefixed.safetensors")
    assert_same(load_weights(tmp_path / "prefixed.safetensors", key="net"), state)

    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[:3], "model-00002-of-00002.safetensors": keys[3:]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for shard, names in shards.items():
        save_file({k: state[k] for k in names}, sharded / shard)
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {k: s for s, names in shards.items() for k in names},
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_same(load_weights(sharded), state)  # the folder: found through its index

    binfolder = tmp_path / "binshards"
    binfolder.mkdir()
    torch.save({k: state[k] for k in keys[:2]}, binfolder / "pytorch_model-1.bin")
    torch.save({k: state[k] for k in keys[2:]}, binfolder / "pytorch_model-2.bin")
    bin_map = {k: "pytorch_model-1.bin" if k in keys[:2] else "pytorch_model-2.bin" for k in keys}
    (binfolder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": bin_map}))
    assert_same(load_weights(binfolder / "pytorch_model.bin.index.json"), state)

    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"shard model-00002-of-00002.safetensors is missing"):
        load_weights(sharded)


def test_unreadable_files(tmp_path: Path, state: dict) -> None:
    torch.save(state, tmp_path / "a.pt")
    data = (tmp_path / "a.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    save_file(state, tmp_path / "b.safetensors")
    (tmp_path / "truncated.safetensors").write_bytes((tmp_path / "b.safetensors").read_bytes()[:100])
    torch.save({"model": state, "args": Path("x")}, tmp_path / "objects.pt")
    with pytest.raises(CheckpointError, match=r"truncated.pt: cannot read the checkpoint.*copy it again"):
        load_weights(tmp_path / "truncated.pt")
    with pytest.raises(CheckpointError, match=r"truncated.safetensors: cannot read the safetensors"):
        load_weights(tmp_path / "truncated.safetensors")
    refused = r"objects.pt: holds Python objects.*Unsupported global: GLOBAL pathlib.PosixPath\). Save"
    with pytest.raises(CheckpointError, match=refused):
        load_weights(tmp_path / "objects.pt")
    with pytest.raises(CheckpointError, match=r"missing.pt: checkpoint not found.*checkpoints.path"):
        load_weights(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------------------------
# Fitting keys


def test_fit_exact_ddp_and_prefixes(state: dict) -> None:
    net = Net()
    assert fit_weights(net, state, source="x.pt").ok
    assert_same(net.state_dict(), state)
    net = Net()
    fit_weights(net, {"module." + k: v for k, v in state.items()}, source="ddp.pt")  # removed silently
    assert_same(net.state_dict(), state)

    lightning = {"model." + k: v for k, v in state.items()} | {"loss_fn.weight": torch.ones(2)}
    with pytest.raises(CheckpointError) as info:
        fit_weights(Net(), lightning, source="epoch=3.ckpt")
    msg = str(info.value)
    assert msg.startswith("epoch=3.ckpt: the weights do not fit Net (")
    assert f"{len(state)} missing keys ['body.0.bias', 'body.0.weight'" in msg
    assert "carry the prefix 'model.'" in msg and "without it: all keys and shapes fit" in msg
    assert "checkpoints.strip_prefix: 'model.'" in msg
    net = Net()
    fit_weights(net, lightning, source="epoch=3.ckpt", strip="model.")
    assert_same(net.state_dict(), state)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = Net()

    with pytest.raises(
        CheckpointError, match=r"model's keys carry the prefix 'backbone.'.*with it: all keys"
    ):
        fit_weights(Wrapper(), state, source="inner.pt")
    with pytest.raises(CheckpointError, match=r"no key starts with checkpoints.strip_prefix='net.'"):
        fit_weights(Net(), state, source="x.pt", strip="net.")


def test_fit_lists_shapes_first_keys_and_closest_candidate(state: dict) -> None:
    wide = Net(width=6)
    with pytest.raises(CheckpointError) as info:
        fit_weights(
            wide, state, source="w.pt", candidates={"net4": shapes_of(Net()), "net6": shapes_of(Net(6))}
        )
    msg = str(info.value)
    assert "shape mismatches ['body.0.bias: file (4,) vs model (6,)'" in msg and "and 1 more" in msg
    assert "the keys look most like 'net4' (100% of names and shapes shared)" in msg
    assert "model.factory/model.kwargs" in msg
    many = {f"extra.{i}": torch.zeros(1) for i in range(9)} | state
    with pytest.raises(CheckpointError, match=r"9 unexpected keys \['extra.0', .*'extra.5'\] and 3 more"):
        fit_weights(Net(), many, source="m.pt")
    # not strict: missing and unexpected keys allowed and reported; shapes never
    partial = {k: v for k, v in many.items() if not k.startswith("head")}
    net = Net()
    head_before = net.head.weight.clone()
    fit = fit_weights(net, partial, source="p.pt", strict=False)
    assert fit.missing == ["head.bias", "head.weight"] and len(fit.unexpected) == 9 and not fit.ok
    assert torch.equal(net.head.weight, head_before) and torch.equal(
        net.body[0].weight, state["body.0.weight"]
    )
    with pytest.raises(CheckpointError, match="shape mismatches"):
        fit_weights(Net(6), state, source="w.pt", strict=False)


def test_compare_and_suggest() -> None:
    expected = {"a.w": (2,), "b.w": (3,)}
    fit = compare_keys({"a.w": torch.zeros(2), "c.w": torch.zeros(1), "b.w": torch.zeros(4)}, expected)
    assert fit.missing == [] and fit.unexpected == ["c.w"] and fit.shapes == [("b.w", (4,), (3,))]
    assert suggest_prefix(["net.enc.a.w", "net.enc.b.w"], ["a.w", "b.w"]) == ("strip", "net.enc.")
    assert suggest_prefix(["a.w", "b.w"], ["m.a.w", "m.b.w", "head.w"]) == ("add", "m.")
    assert suggest_prefix(["a.w"], ["a.w", "b.w"]) is None


# ---------------------------------------------------------------------------------------------
# Trainer folders


def _state(step: int, epoch: float, log: list | None = None) -> str:
    return json.dumps({"global_step": step, "epoch": epoch, "max_steps": 40, "log_history": log or []})


def make_output_dir(root: Path, state: dict) -> Path:
    """checkpoint-5 (own state), -10 (.bin), -15 (no state: from the log), -100; noise to ignore."""
    out = root / "out"
    for step in (5, 10, 15, 100):
        ckpt = out / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        if step == 10:
            torch.save(state, ckpt / "pytorch_model.bin")
        else:
            save_file(state, ckpt / "model.safetensors")
        if step != 15:
            log = [{"loss": 1.0, "epoch": s / 7, "step": s} for s in range(5, step + 1, 5)]
            (ckpt / "trainer_state.json").write_text(_state(step, step / 7, log))
    (out / "runs").mkdir()
    (out / "tmp-checkpoint-120").mkdir()
    (out / "checkpoint-best").mkdir()
    (out / "README.md").write_text("x")
    return out


def test_trainer_listing_and_step_epochs(tmp_path: Path, state: dict) -> None:
    out = make_output_dir(tmp_path, state)
    listed = list_trainer_checkpoints(out)
    assert [s for s, _ in listed] == [5, 10, 15, 100]
    assert [p.name for _, p in listed] == ["checkpoint-5", "checkpoint-10", "checkpoint-15", "checkpoint-100"]
    assert weights_file(listed[1][1]).name == "pytorch_model.bin"
    rows = trainer_step_epochs(out)
    assert [(r.step, r.epoch, r.epoch_source) for r in rows] == [
        (5, 5 / 7, "trainer_state"),
        (10, 10 / 7, "trainer_state"),
        (15, 15 / 7, "log_history"),
        (100, 100 / 7, "trainer_state"),
    ]
    for r in rows:
        assert_same(load_weights(r.path), state)
        assert r.weights == weights_file(r.path)
    table = step_epoch_table(out)
    assert list(table.columns) == ["step", "epoch", "epoch_source", "path"]
    assert table["step"].tolist() == [5, 10, 15, 100] and table["epoch"].iloc[2] == pytest.approx(15 / 7)

    with pytest.raises(CheckpointError, match=r"out: a Trainer output folder holding 4 checkpoints"):
        load_weights(out)

    # no log entry for 15: interpolated from the latest state (100 steps = 100/7 epochs)
    for step in (5, 10, 100):
        (out / f"checkpoint-{step}" / "trainer_state.json").write_text(_state(step, step / 7))
    assert trainer_step_epochs(out)[2].epoch_source == "interpolated"
    assert trainer_step_epochs(out)[2].epoch == pytest.approx(15 / 7)
    # no states at all: steps_per_epoch, else an error naming the checkpoint and the fix
    for step in (5, 10, 100):
        (out / f"checkpoint-{step}" / "trainer_state.json").unlink()
    assert [r.epoch for r in trainer_step_epochs(out, steps_per_epoch=5)] == [1, 2, 3, 20]
    with pytest.raises(
        CheckpointError, match=r"checkpoint-5: no trainer_state.json.*checkpoints.steps_per_epoch"
    ):
        trainer_step_epochs(out)
    # the tables' train_epoch column from the config's checkpoints.steps_per_epoch (a key the
    # schema takes: the error above names it)
    checkpoints = {"source": "folder", "path": str(out / "checkpoint-{epoch}")}
    table = pd.DataFrame({"index": [0, 0], "epoch": [10, 100]})
    with pytest.raises(CheckpointError, match=r"checkpoints.steps_per_epoch"):
        insert_training_epochs(table.copy(), checkpoints)
    assert insert_training_epochs(table, {**checkpoints, "steps_per_epoch": 5})
    assert table["train_epoch"].tolist() == [2, 20]
    run = {
        "data": {"source": "digits"},
        "schedule": "none",
        "model": {"name": "small_cnn"},
        "checkpoints": {**checkpoints, "steps_per_epoch": 5},
    }
    checked = validate({"runs": {"r": run}}, Path(__file__).parents[3] / "config" / "schema.yaml")
    assert checked["runs"]["r"]["checkpoints"]["steps_per_epoch"] == 5
    (out / "checkpoint-10" / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"checkpoint-10/trainer_state.json: unreadable"):
        trainer_step_epochs(out)


def test_trainer_folder_errors(tmp_path: Path, state: dict) -> None:
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    with pytest.raises(CheckpointError) as info:
        list_trainer_checkpoints(empty)
    msg = str(info.value)
    assert f"{empty}: no checkpoint-{{step}}/ folders (found ['runs'])" in msg and "save_strategy" in msg
    final = tmp_path / "final"
    final.mkdir()
    save_file(state, final / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"single saved model"):
        list_trainer_checkpoints(final)
    assert_same(load_weights(final), state)  # as one checkpoint it loads
    with pytest.raises(CheckpointError, match=r"nowhere: no such folder.*output_dir"):
        list_trainer_checkpoints(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    (broken / "checkpoint-3").mkdir(parents=True)
    (broken / "checkpoint-3" / "optimizer.pt").write_bytes(b"")
    with pytest.raises(
        CheckpointError, match=r"checkpoint-3: no model weights .*found \['optimizer.pt'\].*incomplete"
    ):
        list_trainer_checkpoints(broken)


def test_dag_time_modules_do_not_import_torch() -> None:
    code = (
        "import sys; import epochlens.formats.trainer_folders, epochlens.formats.factory; "
        "bad = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
