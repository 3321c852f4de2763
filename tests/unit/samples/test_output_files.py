"""Sample-output shards: stacked per shard, merged into the index's file (samples/output_files.py)."""

from __future__ import annotations

import numpy as np
import pytest

from epochlens.errors import DataError
from epochlens.samples.output_files import merge_outputs, stack_outputs, write_outputs
from epochlens.shards import shard_range

N = {"train": 11, "test": 7}


def checkpoint(epoch: int, shard=(0, 1)) -> dict:
    """One checkpoint's outputs of ``shard`` as checkpoint_outputs returns them (random values,
    the same rows for the same epoch whatever the shard)."""
    full = np.random.default_rng(epoch)
    arrays: dict = {"epoch": np.int64(epoch)}
    for split, n in N.items():
        lo, hi = shard_range(n, *shard)
        arrays[f"{split}_rows"] = np.array([lo, hi, n])
        loss, correct = full.random(n), full.random(n) > 0.5
        loss[::4] = np.nan
        arrays[f"{split}_loss"], arrays[f"{split}_correct"] = loss[lo:hi], correct[lo:hi]
    return arrays


def write_shards(folder, epochs, nshards) -> list:
    paths = []
    for k in range(nshards):
        path = folder / f"shard_{k}-of-{nshards}.npz"
        write_outputs(path, stack_outputs((checkpoint(e, (k, nshards)) for e in epochs), len(epochs)))
        paths.append(path)
    return paths


@pytest.mark.parametrize("nshards", [1, 3, 7])
def test_merged_shards_equal_the_whole(tmp_path, nshards):
    epochs = [0, 2, 5]
    whole = stack_outputs((checkpoint(e) for e in epochs), len(epochs))
    merge_outputs(write_shards(tmp_path, epochs, nshards), tmp_path / "merged.npz")
    with np.load(tmp_path / "merged.npz") as merged:
        expected = [k for k in whole if not k.endswith("_rows")]
        assert merged.files == expected  # the series in their order, no row keys
        for key in expected:
            assert merged[key].dtype == whole[key].dtype
            np.testing.assert_array_equal(merged[key], whole[key])
    assert whole["train_loss"].shape == (3, N["train"])


def test_shards_that_do_not_tile_are_refused(tmp_path):
    paths = write_shards(tmp_path, [0, 1], 3)
    with pytest.raises(DataError, match=r"shard_2-of-3.npz: train samples from 8, the shards before end"):
        merge_outputs([paths[0], paths[2]], tmp_path / "out.npz")
    with pytest.raises(DataError, match=r"shard_1-of-3.npz: the shards' train samples end at 8 of 11"):
        merge_outputs(paths[:2], tmp_path / "out.npz")
    (tmp_path / "other").mkdir()
    other = write_shards(tmp_path / "other", [0, 2], 3)
    with pytest.raises(DataError, match=r"other/shard_1-of-3.npz: its checkpoints or series differ"):
        merge_outputs([paths[0], other[1], paths[2]], tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()
