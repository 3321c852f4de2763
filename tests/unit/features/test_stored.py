"""Features from stored activations (epochlens.features.stored): every layout gives the same
values as the arrays written, rows are aligned by an id column, and bad input is a clear error
naming the layer and the file, with nothing cached lost."""

from __future__ import annotations

import dataclasses

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file
from safetensors.torch import save_file as torch_save

from epochlens.errors import ConfigError, FeatureError
from epochlens.features import representations as reps
from epochlens.features import stored_representations as srep
from epochlens.features.cache import FeatureSet
from epochlens.features.settings import RepresentationSettings
from epochlens.features.stored import Snapshot, arrow_numpy, layer_features, load_or_build
from epochlens.features.stored_settings import StoredFeatureSettings

N = {"train": 9, "test": 5}
SHAPE = (4, 3)  # (tokens, dims)


@dataclasses.dataclass
class Labels:
    """The part of a data set that stored features read: labels per split and a content hash."""

    train: np.ndarray
    test: np.ndarray
    content_hash: str = "hash"

    def labels(self, split):
        return getattr(self, split)


def activations(seed=0):
    rng = np.random.default_rng(seed)
    return {
        s: {f"layer_{i}": rng.normal(size=(n, *SHAPE)).astype(np.float16) for i in (0, 1, 10)}
        for s, n in N.items()
    }


def write(folder, fmt, acts, ids=None):
    """``acts`` in layout ``fmt``; ``ids``: {split: row positions} as an ``idx`` column / file."""
    if fmt == "save_to_disk":
        feats = {k: datasets.Array2D(SHAPE, "float16") for k in acts["train"]} | {
            "idx": datasets.Value("int64")
        }
        dd = {}
        for s, a in acts.items():
            cols = dict(a) | {"idx": ids[s] if ids else np.arange(N[s])}
            dd[s] = datasets.Dataset.from_dict(cols, features=datasets.Features(feats))
        datasets.DatasetDict(dd).save_to_disk(str(folder))
        return
    folder.mkdir(parents=True)
    for s, a in acts.items():
        cols = dict(a) | ({"idx": ids[s]} if ids else {})
        if fmt == "parquet":
            table = {
                k: pa.FixedSizeListArray.from_arrays(
                    pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 3), 4
                )
                if v.ndim == 3
                else pa.array(v)
                for k, v in cols.items()
            }
            pq.write_table(pa.table(table), folder / f"{s}.parquet")
            continue
        (folder / s).mkdir()
        for k, v in cols.items():
            if fmt == "npy":
                np.save(folder / s / f"{k}.npy", v)
            else:
                save_file({"x": np.ascontiguousarray(v)}, str(folder / s / f"{k}.safetensors"))


def labels():
    return Labels(np.arange(N["train"]) % 3, np.arange(N["test"]) % 3)


@pytest.mark.parametrize("fmt", ["save_to_disk", "parquet", "npy", "safetensors"])
def test_every_layout_reads_the_stored_values_in_the_split_order(tmp_path, fmt):
    acts = activations()
    ids = {s: np.random.default_rng(1).permutation(n) for s, n in N.items()}
    shuffled = {s: {} for s in acts}
    for s, a in acts.items():
        for k, v in a.items():
            shuffled[s][k] = v[ids[s]]  # row r holds sample ids[s][r]
    write(tmp_path / "snap", fmt, shuffled, ids)
    snap = Snapshot(tmp_path / "snap", "auto", "idx")
    assert snap.format == fmt
    assert snap.layers("train") == ["layer_0", "layer_1", "layer_10"]  # natural order, idx left out
    settings = StoredFeatureSettings(representations=("mean", "max", "first", "last", "norms", "flat"))
    fns = {r: srep.resolve(r, settings) for r in settings.representations}
    feats, shape = layer_features(snap, "test", "layer_1", N["test"], fns, batch_size=2)
    x = acts["test"]["layer_1"].astype(np.float32)
    assert shape == SHAPE
    np.testing.assert_allclose(feats["mean"], x.mean(1), rtol=1e-6)
    np.testing.assert_array_equal(feats["max"], x.max(1))
    np.testing.assert_array_equal(feats["first"], x[:, 0])
    np.testing.assert_array_equal(feats["last"], x[:, -1])
    np.testing.assert_allclose(feats["norms"], np.linalg.norm(x, axis=2), rtol=1e-6)
    np.testing.assert_array_equal(feats["flat"], x.reshape(len(x), -1))


def test_image_builtins_are_the_model_features_functions():
    act = torch.randn(6, 5, 4, 4)
    settings = StoredFeatureSettings(representations=("pooled", "stats", "spectral"), spectral_k=3)
    image = RepresentationSettings(spectral_k=3)
    want = reps.compute(act, image, deferred=False)
    for name in settings.representations:
        torch.testing.assert_close(torch.as_tensor(srep.resolve(name, settings)(act)), want[name])


def test_features_file_is_what_probes_read_and_is_cached(tmp_path):
    write(tmp_path / "snap", "npy", activations())
    settings = StoredFeatureSettings(representations=("mean", "stats"), layers=["layer_10"])
    out = tmp_path / "epoch_0001.h5"
    first = load_or_build(out, tmp_path / "snap", labels(), settings)
    assert not first.hit and first.reason == "no cached file"
    fs = FeatureSet(out)
    assert fs.layers == ["layer_10"] and fs.representations == ["mean", "stats"]
    np.testing.assert_array_equal(fs.labels("test"), labels().test)
    assert fs.array("train", "layer_10", "stats").shape == (N["train"], 6)
    assert load_or_build(out, tmp_path / "snap", labels(), settings).hit
    other = dataclasses.replace(settings, user_code={}, representations=("mean", "max"))
    assert load_or_build(out, tmp_path / "snap", labels(), other).reason == "spec changed (representations)"


def bad_rep(kind):
    return {
        "shape": lambda a: a.flatten(1)[:1],  # one row for the batch
        "nan": lambda a: a.flatten(1) * float("nan"),
        "list": lambda a: [1.0],
    }[kind]


@pytest.mark.parametrize(
    ("kind", "message"),
    [("shape", "returned shape (1, 12) for a batch of 2"), ("nan", "non-finite"), ("list", "not a tensor")],
)
def test_a_bad_representation_names_layer_representation_and_file_and_keeps_the_cache(
    tmp_path, monkeypatch, kind, message
):
    write(tmp_path / "snap", "npy", activations())
    out = tmp_path / "epoch_0001.h5"
    load_or_build(out, tmp_path / "snap", labels(), StoredFeatureSettings(representations=("mean",)))
    before = out.read_bytes()
    monkeypatch.setattr(srep, "import_factory", lambda spec: bad_rep(kind))
    settings = StoredFeatureSettings(representations=("mean", "mypkg.reps:bad"), batch_size=2)
    with pytest.raises(FeatureError) as err:
        load_or_build(out, tmp_path / "snap", labels(), settings)
    assert "layer 'layer_0', representation 'mypkg.reps:bad'" in str(err.value)
    assert "layer_0.npy" in str(err.value) and message in str(err.value)
    assert out.read_bytes() == before  # the cached file is untouched


def test_count_id_and_missing_layer_errors_name_the_file(tmp_path):
    acts = activations()
    write(tmp_path / "snap", "npy", acts, ids={s: np.arange(n) for s, n in N.items()})
    snap = Snapshot(tmp_path / "snap", "npy", None)
    fns = {"mean": srep.TOKEN_BUILTINS["mean"]}
    with pytest.raises(
        FeatureError, match=r"layer_1\.npy .*9 rows, but the run's train split has 10 samples"
    ):
        layer_features(snap, "train", "layer_1", 10, fns, 4)
    settings = StoredFeatureSettings(layers=["layer_7"], id_column="idx")
    with pytest.raises(FeatureError, match=r"snap/train: no layer\(s\) \[.layer_7.\]"):
        load_or_build(tmp_path / "f.h5", tmp_path / "snap", labels(), settings)
    np.save(tmp_path / "snap" / "test" / "idx.npy", np.array([0, 1, 2, 2, 3]))
    with pytest.raises(FeatureError, match=r"idx\.npy.*not the positions 0\.\.4.*missing e\.g\. \[4\]"):
        layer_features(Snapshot(tmp_path / "snap", "npy", "idx"), "test", "layer_1", 5, fns, 4)
    assert not (tmp_path / "f.h5").exists()


def test_ragged_rows_and_bad_settings_are_refused(tmp_path):
    ds = datasets.Dataset.from_dict({"layer_0": [[1.0, 2.0], [3.0]]})
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "snap"))
    with pytest.raises(FeatureError, match="rows of different lengths"):
        Snapshot(tmp_path / "snap").layer("train", "layer_0")
    with pytest.raises(ConfigError, match="neither built-ins"):
        StoredFeatureSettings(representations=("median",))


@pytest.mark.parametrize("kind", ["list", "large_list", "fixed_size_list"])
def test_arrow_rows_of_a_sliced_nested_column_are_its_values(kind):
    """Values sliced to the rows' range (no flatten): a slice of a chunk gives its own rows."""
    x = np.arange(7 * 4 * 3, dtype=np.float32).reshape(7, 4, 3)
    make = {
        "list": lambda v, w: pa.ListArray.from_arrays(np.arange(0, len(v) + 1, w, dtype=np.int32), v),
        "large_list": lambda v, w: pa.LargeListArray.from_arrays(np.arange(0, len(v) + 1, w), v),
        "fixed_size_list": lambda v, w: pa.FixedSizeListArray.from_arrays(v, w),
    }[kind]
    column = make(make(pa.array(x.ravel()), 3), 4)
    np.testing.assert_array_equal(arrow_numpy(column.slice(2, 4), "where"), x[2:6])
    np.testing.assert_array_equal(arrow_numpy(column, "where"), x)


def layers_read_into_one_buffer(tmp_path, fmt: str) -> tuple[dict, Snapshot]:
    """A snapshot in layout ``fmt`` whose first two train layers read equal to what was written,
    the second into the first's buffer; returns the activations written and the snapshot."""
    acts = activations()
    write(tmp_path / "snap", fmt, acts)
    snap = Snapshot(tmp_path / "snap", fmt, None)
    first = snap.layer("train", "layer_0").rows(0, N["train"])
    np.testing.assert_array_equal(first, acts["train"]["layer_0"])
    second = snap.layer("train", "layer_1").rows(0, N["train"])
    np.testing.assert_array_equal(second, acts["train"]["layer_1"])
    assert np.shares_memory(first, second)  # the next layer reuses the buffer
    return acts, snap


def test_npy_layers_are_read_into_one_reused_buffer_and_fortran_arrays_still_read(tmp_path):
    acts, snap = layers_read_into_one_buffer(tmp_path, "npy")
    np.save(tmp_path / "snap" / "test" / "layer_0.npy", np.asfortranarray(acts["test"]["layer_0"]))
    fortran = Snapshot(tmp_path / "snap", "npy", None).layer("test", "layer_0").rows(0, N["test"])
    np.testing.assert_array_equal(fortran, acts["test"]["layer_0"])
    (tmp_path / "snap" / "test" / "layer_1.npy").write_bytes(
        (tmp_path / "snap" / "test" / "layer_1.npy").read_bytes()[:-10]
    )
    with pytest.raises(FeatureError, match=r"layer_1\.npy \(layer 'layer_1'\): the file is truncated"):
        snap.layer("test", "layer_1")


@pytest.mark.parametrize("fmt", ["save_to_disk", "parquet", "npy", "safetensors"])
def test_a_snapshot_with_fewer_rows_or_no_such_layer_keeps_the_cached_file(tmp_path, fmt):
    """Every layout: the error names the layer and its file, and the features file built before
    from the complete snapshot keeps its bytes."""
    acts = activations()
    write(tmp_path / "good", fmt, acts)
    out = tmp_path / "epoch_0001.h5"
    settings = StoredFeatureSettings(representations=("mean",), layers=["layer_0", "layer_1"])
    load_or_build(out, tmp_path / "good", labels(), settings)
    before = out.read_bytes()
    if fmt == "save_to_disk":  # its idx column, not named as the id column: not a layer, left out
        every = dataclasses.replace(settings, layers=None)
        load_or_build(tmp_path / "every.h5", tmp_path / "good", labels(), every)
        assert FeatureSet(tmp_path / "every.h5").layers == ["layer_0", "layer_1", "layer_10"]
    short = {s: {k: v[:-1] if s == "test" else v for k, v in a.items()} for s, a in acts.items()}
    ids = {s: np.arange(len(a["layer_0"])) for s, a in short.items()} if fmt == "save_to_disk" else None
    write(tmp_path / "short", fmt, short, ids)
    with pytest.raises(FeatureError) as err:
        load_or_build(out, tmp_path / "short", labels(), settings)
    assert "(layer 'layer_0')" in str(err.value) and "4 rows, but the run's test split has 5" in str(
        err.value
    )
    assert str(tmp_path / "short" / "test") in str(err.value)
    missing = dataclasses.replace(settings, layers=["layer_0", "layer_2"])
    with pytest.raises(FeatureError, match=r"no layer\(s\) \['layer_2'\]") as err:
        load_or_build(out, tmp_path / "good", labels(), missing)
    assert str(tmp_path / "good" / "train") in str(err.value)
    assert out.read_bytes() == before


def test_a_save_to_disk_layer_over_several_files_is_one_array(tmp_path):
    """Three Arrow files of the train split: one array of the split's rows, so a batch across two
    files is a view; its values are the stored ones in order."""
    acts = activations()
    feats = datasets.Features({k: datasets.Array2D(SHAPE, "float16") for k in acts["train"]})
    dd = datasets.DatasetDict(
        {s: datasets.Dataset.from_dict(dict(a), features=feats) for s, a in acts.items()}
    )
    dd.save_to_disk(str(tmp_path / "snap"), num_shards={"train": 3, "test": 1})
    snap = Snapshot(tmp_path / "snap")
    assert len(snap._arrow("train").files) == 3
    layer = snap.layer("train", "layer_10")
    assert len(layer.pieces) == 1
    np.testing.assert_array_equal(layer.rows(2, 7), acts["train"]["layer_10"][2:7])
    np.testing.assert_array_equal(layer.take(np.array([8, 0, 4])), acts["train"]["layer_10"][[8, 0, 4]])


SAFETENSORS_NUMPY = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16"]


@pytest.mark.parametrize("dtype", [*SAFETENSORS_NUMPY, "uint32", "uint64", "bfloat16"])
def test_a_safetensors_layer_of_every_dtype_reads_what_safetensors_loads(tmp_path, dtype):
    """Files written by safetensors itself (numpy, or torch for bfloat16, with metadata): rows and
    taken rows equal safetensors' own load (bfloat16: its float32 values, exactly)."""
    rng = np.random.default_rng(3)
    values = rng.normal(size=(7, *SHAPE)) * 50
    for s in N:
        (tmp_path / "snap" / s).mkdir(parents=True, exist_ok=True)
    path = tmp_path / "snap" / "train" / "layer_0.safetensors"
    if dtype == "bfloat16":
        torch_save({"h": torch.from_numpy(values).bfloat16()}, str(path), metadata={"format": "pt"})
        want = load_file(str(path))["h"].float().numpy()
        assert not np.array_equal(want, values.astype(np.float32))  # rounded to bfloat16
    else:
        save_file({"h": values.astype(dtype)}, str(path), metadata={"layer": "0"})
        want = load_file(str(path))["h"].numpy()
    layer = Snapshot(tmp_path / "snap", "safetensors").layer("train", "layer_0")
    got = layer.rows(0, 7)
    assert got.dtype == (np.float32 if dtype == "bfloat16" else want.dtype)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(layer.rows(2, 5), want[2:5])
    np.testing.assert_array_equal(layer.take(np.array([6, 0, 3])), want[[6, 0, 3]])


def test_safetensors_layers_share_a_buffer_and_bad_files_name_the_file(tmp_path):
    acts, snap = layers_read_into_one_buffer(tmp_path, "safetensors")
    test = tmp_path / "snap" / "test"
    (test / "layer_1.safetensors").write_bytes((test / "layer_1.safetensors").read_bytes()[:-10])
    with pytest.raises(
        FeatureError, match=r"layer_1\.safetensors \(layer 'layer_1'\): the file is truncated"
    ):
        snap.layer("test", "layer_1")
    save_file({"a": acts["test"]["layer_0"], "b": acts["test"]["layer_0"]}, str(test / "layer_0.safetensors"))
    with pytest.raises(
        FeatureError, match=r"layer_0\.safetensors .*2 tensors \['a', 'b'\]; store one tensor"
    ):
        snap.layer("test", "layer_0")
    (test / "layer_10.safetensors").write_bytes(b"\xff" * 4)
    with pytest.raises(FeatureError, match=r"layer_10\.safetensors .*not a safetensors file or truncated"):
        snap.layer("test", "layer_10")
    save_file({"x": np.zeros((5, 2), dtype=bool)}, str(test / "layer_10.safetensors"))
    with pytest.raises(FeatureError, match=r"layer_10\.safetensors .*dtype BOOL"):
        snap.layer("test", "layer_10")


@pytest.mark.parametrize("fmt", ["safetensors", "parquet"])
def test_features_of_a_snapshot_equal_the_save_to_disk_ones(tmp_path, fmt):
    """The same activations in each layout (rows shuffled, an id column): the same features file."""
    acts = activations(seed=4)
    ids = {s: np.random.default_rng(5).permutation(n) for s, n in N.items()}
    shuffled = {s: {k: v[ids[s]] for k, v in a.items()} for s, a in acts.items()}
    settings = StoredFeatureSettings(representations=("mean", "norms", "flat"), id_column="idx")
    sets = {}
    for layout in ("save_to_disk", fmt):
        write(tmp_path / layout, layout, shuffled, ids)
        load_or_build(tmp_path / f"{layout}.h5", tmp_path / layout, labels(), settings)
        sets[layout] = FeatureSet(tmp_path / f"{layout}.h5")
    assert sets[fmt].layers == sets["save_to_disk"].layers == ["layer_0", "layer_1", "layer_10"]
    for s in N:
        for layer in sets[fmt].layers:
            for rep in settings.representations:
                want = sets["save_to_disk"].array(s, layer, rep)
                np.testing.assert_array_equal(sets[fmt].array(s, layer, rep), want)
    flat = sets[fmt].array("test", "layer_1", "flat")
    np.testing.assert_array_equal(flat, acts["test"]["layer_1"].reshape(N["test"], -1))


def test_a_parquet_split_of_several_files_reads_in_order_and_a_missing_column_names_the_file(tmp_path):
    acts = activations()
    write(tmp_path / "one", "parquet", acts)
    split = tmp_path / "snap" / "train"
    split.mkdir(parents=True)
    table = pq.read_table(tmp_path / "one" / "train.parquet")
    pq.write_table(table.slice(0, 4), split / "part-0.parquet")
    pq.write_table(table.slice(4), split / "part-1.parquet", row_group_size=2)
    pq.write_table(pq.read_table(tmp_path / "one" / "test.parquet"), tmp_path / "snap" / "test.parquet")
    snap = Snapshot(tmp_path / "snap", "auto")
    layer = snap.layer("train", "layer_10")
    assert len(layer) == N["train"] and layer.shape == SHAPE
    np.testing.assert_array_equal(layer.rows(0, N["train"]), acts["train"]["layer_10"])
    np.testing.assert_array_equal(layer.rows(3, 6), acts["train"]["layer_10"][3:6])  # across files
    np.testing.assert_array_equal(snap.layer("test", "layer_1").rows(0, 5), acts["test"]["layer_1"])
    pq.write_table(table.slice(4).drop_columns(["layer_1"]), split / "part-1.parquet")
    with pytest.raises(FeatureError, match=r"part-1\.parquet \(layer 'layer_1'\): no such column"):
        Snapshot(tmp_path / "snap", "parquet").layer("train", "layer_1")


def test_parquet_converted_by_the_readme_call_reads_the_same(tmp_path):
    """README: ``Dataset.from_parquet(...).save_to_disk(...)`` once per split turns a parquet
    snapshot into a save_to_disk one (read at disk speed) holding the same values."""
    acts = activations()
    write(tmp_path / "pq", "parquet", acts)
    converted = datasets.DatasetDict(
        {
            s: datasets.Dataset.from_parquet(
                str(tmp_path / "pq" / f"{s}.parquet"), cache_dir=str(tmp_path / "c")
            )
            for s in N
        }
    )
    converted.save_to_disk(str(tmp_path / "std"))
    snap = Snapshot(tmp_path / "std")
    assert snap.format == "save_to_disk" and snap.layers("test") == ["layer_0", "layer_1", "layer_10"]
    for s in N:
        np.testing.assert_array_equal(snap.layer(s, "layer_10").rows(0, N[s]), acts[s]["layer_10"])
