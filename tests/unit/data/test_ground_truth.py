"""data.ground_truth: your own poisoned samples from a boolean column (npz, tables, texts, image
columns) or a positions file, kept in dataset.h5, and the config checks made before any job."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from epochlens import config as run_config
from epochlens.data import load_npz, read_dataset, write_dataset
from epochlens.data.ground_truth import as_flags, read_positions_file
from epochlens.errors import ConfigError, DataError
from epochlens.formats.image_decode import ImageSettings
from epochlens.formats.images import load_parquet
from epochlens.formats.tables import TableSettings, load_table

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


def test_only_booleans_are_a_ground_truth_column() -> None:
    np.testing.assert_array_equal(as_flags([True, False, True], "bad", "f"), [True, False, True])
    np.testing.assert_array_equal(as_flags(np.array([False, True]), "bad", "f"), [False, True])
    with pytest.raises(DataError, match=r"f: the ground-truth column 'bad' holds int64, not booleans"):
        as_flags(np.array([0, 1]), "bad", "f")
    with pytest.raises(DataError, match=r"holds \['str'\]"):
        as_flags(["yes", "no"], "bad", "f")


def test_positions_files(tmp_path) -> None:
    np.save(tmp_path / "p.npy", np.array([4, 1, 1]))
    np.testing.assert_array_equal(read_positions_file(tmp_path / "p.npy", 10), [1, 4])
    (tmp_path / "p.txt").write_text("# flipped by my script\n3\n0\n\n7  # the last one\n")
    np.testing.assert_array_equal(read_positions_file(tmp_path / "p.txt", 8), [0, 3, 7])
    with pytest.raises(DataError, match=r"positions \[7\] are outside the training split \(0 .. 6\)"):
        read_positions_file(tmp_path / "p.txt", 7)
    np.save(tmp_path / "b.npy", np.array([True, False]))
    with pytest.raises(DataError, match="a boolean array"):
        read_positions_file(tmp_path / "b.npy")
    (tmp_path / "f.txt").write_text("1.5\n")
    with pytest.raises(DataError, match="must be integers"):
        read_positions_file(tmp_path / "f.txt")
    with pytest.raises(DataError, match="no such file"):
        read_positions_file(tmp_path / "missing.npy")


def test_an_npz_column_is_kept_in_dataset_h5(tmp_path, rng) -> None:
    x = rng.standard_normal((10, 3)).astype(np.float32)
    poisoned = np.arange(10) % 4 == 0
    np.savez(tmp_path / "d.npz", x_train=x, y_train=x, x_test=x[:4], y_test=x[:4], poisoned=poisoned)
    ds = load_npz(tmp_path / "d.npz", ground_truth_column="poisoned")
    np.testing.assert_array_equal(ds.ground_truth, poisoned)
    before = ds.content_hash
    write_dataset(ds, tmp_path / "dataset.h5")
    back = read_dataset(tmp_path / "dataset.h5")
    np.testing.assert_array_equal(back.ground_truth, poisoned)
    assert back.content_hash == before  # no model sees it: not hashed
    with pytest.raises(DataError, match="no array 'flipped'"):
        load_npz(tmp_path / "d.npz", ground_truth_column="flipped")


def test_a_table_column_and_an_image_column(tmp_path, rng) -> None:
    df = pd.DataFrame(
        {"a": rng.standard_normal(8), "y": rng.standard_normal(8), "split": ["train"] * 6 + ["test"] * 2}
    )
    df["poisoned"] = [False, True, False, False, True, False, None, None]  # test rows: not read
    df.loc[:5, "poisoned"] = df.loc[:5, "poisoned"].astype(bool)
    df.to_json(tmp_path / "t.jsonl", orient="records", lines=True)
    settings = TableSettings(["a"], ["y"], split_column="split", ground_truth_column="poisoned")
    ds = load_table("jsonl", tmp_path / "t.jsonl", settings)
    np.testing.assert_array_equal(ds.ground_truth, [False, True, False, False, True, False])

    def png(value: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    rows = pd.DataFrame(
        {
            "image": [{"bytes": png(v), "path": None} for v in range(6)],
            "label": [0, 1, 0, 1, 0, 1],
            "split": ["train"] * 4 + ["test"] * 2,
            "flipped": [True, False, False, True, False, False],
        }
    )
    rows.to_parquet(tmp_path / "images.parquet")
    images = load_parquet(
        tmp_path / "images.parquet", ImageSettings(split_column="split", ground_truth_column="flipped")
    )
    np.testing.assert_array_equal(images.ground_truth, [True, False, False, True])


def _run(folder: Path, **data) -> dict:
    x = np.zeros((6, 2), np.float32)
    np.savez(folder / "d.npz", x_train=x, y_train=np.arange(6) % 2, x_test=x, y_test=np.arange(6) % 2,
             poisoned=np.arange(6) < 2, codes=np.arange(6))  # fmt: skip
    (folder / "ckpt").mkdir(exist_ok=True)
    (folder / "ckpt" / "m_0.pt").touch()
    run = {
        "data": {"source": "npz", "path": str(folder / "d.npz"), **data},
        "model": {"name": "small_cnn"},
        "schedule": "none",
        "checkpoints": {"source": "folder", "path": str(folder / "ckpt" / "m_{epoch}.pt")},
    }
    return {"runs": {"r": run}}


def test_bad_ground_truth_is_refused_before_any_job(tmp_path) -> None:
    assert run_config.validate(_run(tmp_path, ground_truth={"column": "poisoned"}), SCHEMA)
    np.save(tmp_path / "p.npy", np.array([0, 9]))
    bad = [
        ({"ground_truth": {"column": "codes"}}, "holds int64, not booleans"),
        ({"ground_truth": {"indices": str(tmp_path / "p.npy")}}, r"positions \[9\] are outside .*0 .. 5"),
        ({"ground_truth": {"column": "poisoned"}, "corruption": {"kind": "label_flip"}}, "keep one"),
    ]
    for data, match in bad:
        with pytest.raises(ConfigError, match=match):
            run_config.validate(copy.deepcopy(_run(tmp_path, **data)), SCHEMA)
    digits = _run(tmp_path)
    digits["runs"]["r"]["data"] = {"source": "digits", "ground_truth": {"column": "poisoned"}}
    with pytest.raises(ConfigError, match="digits data has no columns; give the positions in a file"):
        run_config.validate(digits, SCHEMA)
