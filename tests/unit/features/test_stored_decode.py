"""A parquet snapshot decoded once into .npy layers (epochlens.features.stored_decode): the same
features as read from the parquet files, its checks name the parquet file, and a failed decode
leaves no folder behind."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_stored import N, activations, labels, write

from epochlens.errors import FeatureError
from epochlens.features.cache import FeatureSet
from epochlens.features.stored import Snapshot, load_or_build
from epochlens.features.stored_decode import decode_parquet
from epochlens.features.stored_settings import StoredFeatureSettings, decoded_once, detect_format


def shuffled_parquet(folder):
    acts = activations(seed=7)
    ids = {s: np.random.default_rng(8).permutation(n) for s, n in N.items()}
    write(folder, "parquet", {s: {k: v[ids[s]] for k, v in a.items()} for s, a in acts.items()}, ids)
    return acts, ids


@pytest.mark.parametrize("threads", [1, 2])
def test_decoded_layers_are_the_parquet_values_and_give_the_same_features(tmp_path, threads):
    acts, ids = shuffled_parquet(tmp_path / "pq")
    settings = StoredFeatureSettings(representations=("mean", "flat"), id_column="idx")
    done = decode_parquet(tmp_path / "pq", tmp_path / "npy", N, settings, threads=threads)
    assert done.layers == ["layer_0", "layer_1", "layer_10"]
    assert done.nbytes == sum(v.nbytes for a in acts.values() for v in a.values()) + sum(
        i.nbytes for i in ids.values()
    )
    assert detect_format(tmp_path / "npy") == "npy" and not (tmp_path / "npy.partial").exists()
    for s in N:
        assert sorted(p.name for p in (tmp_path / "npy" / s).iterdir()) == [
            "idx.npy", "layer_0.npy", "layer_1.npy", "layer_10.npy",
        ]  # fmt: skip
        decoded = np.load(tmp_path / "npy" / s / "layer_10.npy")
        assert decoded.dtype == np.float16  # the stored bytes, nothing wider
        np.testing.assert_array_equal(decoded, acts[s]["layer_10"][ids[s]])
    for name, fmt in (("pq", "parquet"), ("npy", "npy")):
        load_or_build(tmp_path / f"{name}.h5", tmp_path / name, labels(), settings)
        assert FeatureSet(tmp_path / f"{name}.h5").attrs["snapshot_format"] == fmt
    a, b = FeatureSet(tmp_path / "pq.h5"), FeatureSet(tmp_path / "npy.h5")
    for s in N:
        for layer in a.layers:
            for rep in settings.representations:
                np.testing.assert_array_equal(a.array(s, layer, rep), b.array(s, layer, rep))


def test_only_the_layers_asked_for_are_decoded(tmp_path):
    shuffled_parquet(tmp_path / "pq")
    settings = StoredFeatureSettings(layers=["layer_1"], id_column="idx")
    decode_parquet(tmp_path / "pq", tmp_path / "npy", N, settings)
    assert Snapshot(tmp_path / "npy", "npy", "idx").layers("train") == ["layer_1"]


def test_bad_snapshots_fail_naming_the_parquet_file_and_leave_no_folder(tmp_path):
    shuffled_parquet(tmp_path / "pq")
    settings = StoredFeatureSettings(id_column="idx")
    decode_parquet(tmp_path / "pq", tmp_path / "npy", N, settings)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "npy").rglob("*.npy")}
    cases = [
        ({"train": 10, "test": 5}, settings, r"train\.parquet.*not the positions 0\.\.9"),
        (N, StoredFeatureSettings(layers=["idx"]), r"train\.parquet: \['idx'\] hold one value per row"),
        (N, StoredFeatureSettings(layers=["layer_7"], id_column="idx"), r"train\.parquet.*no layer\(s\)"),
    ]  # fmt: skip
    for counts, bad, message in cases:
        with pytest.raises(FeatureError, match=message):
            decode_parquet(tmp_path / "pq", tmp_path / "new", counts, bad)
        with pytest.raises(FeatureError, match=message):  # an earlier complete folder is kept
            decode_parquet(tmp_path / "pq", tmp_path / "npy", counts, bad)
        assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()
        assert {p: p.stat().st_mtime_ns for p in (tmp_path / "npy").rglob("*.npy")} == before
    table = pq.read_table(tmp_path / "pq" / "test.parquet")
    pq.write_table(table.slice(0, 3), tmp_path / "pq" / "test.parquet")
    with pytest.raises(FeatureError, match=r"test\.parquet.*3 ids, not the positions 0\.\.4"):
        decode_parquet(tmp_path / "pq", tmp_path / "new", N, settings)


def test_parquet_snapshots_are_decoded_once_and_others_are_read_as_they_are(tmp_path):
    shuffled_parquet(tmp_path / "pq")
    write(tmp_path / "npy", "npy", activations())
    assert decoded_once(tmp_path / "pq", "auto") and decoded_once(tmp_path / "absent", "parquet")
    assert not decoded_once(tmp_path / "npy", "auto") and not decoded_once(tmp_path / "absent", "auto")
    assert not decoded_once(tmp_path / "pq", "save_to_disk")
