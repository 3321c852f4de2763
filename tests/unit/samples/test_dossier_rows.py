"""The dossier's training rows built a chunk of rows at a time equal the rows built at once."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from epochlens.data import write_dataset
from epochlens.samples import dossier
from epochlens.samples.dossier import DossierInputs, build_dossier


def _inputs(tmp_path, data) -> DossierInputs:
    """A run of two checkpoints: its dataset.h5, no corrupted samples, one index's outputs with a
    NaN where a sample's class was not yet active."""
    write_dataset(data, tmp_path / "dataset.h5")
    np.save(tmp_path / "corrupted.npy", np.array([3, 7], np.int64))
    rng = np.random.default_rng(0)
    arrays = {"epochs": np.array([1, 2])}
    for split, n in (("train", len(data.train_labels)), ("test", len(data.test_labels))):
        loss = rng.random((2, n))
        loss[0, ::4] = np.nan
        series = {"loss": loss, "p_label": rng.random((2, n)), "margin": rng.normal(size=(2, n))}
        series.update(correct=rng.random((2, n)) > 0.5, predicted=rng.integers(0, 3, (2, n)))
        arrays.update({f"{split}_{key}": values for key, values in series.items()})
    np.savez(tmp_path / "outputs.npz", **arrays)
    return DossierInputs(
        run="tiny", task="classification", dataset=tmp_path / "dataset.h5",
        corrupted=tmp_path / "corrupted.npy", epochs=[1, 2], outputs={0: tmp_path / "outputs.npz"},
    )  # fmt: skip


def test_rows_in_chunks_equal_rows_at_once(tmp_path, tiny_dataset, monkeypatch):
    inputs = _inputs(tmp_path, tiny_dataset)
    whole = build_dossier(inputs)
    monkeypatch.setattr(dossier, "ROWS", 5)  # 12 training rows: chunks of 5, 5, 2
    chunked = build_dossier(inputs)
    assert whole.num_rows == chunked.num_rows == 12
    assert [c.num_chunks for c in whole.columns] == [1] * whole.num_columns
    assert {c.num_chunks for c in chunked.columns} == {3}
    assert chunked.schema.equals(whole.schema, check_metadata=True)
    combined = chunked.combine_chunks()
    for name in whole.column_names:  # NaN-aware: pandas compares NaN equal to NaN
        assert combined[name].to_pandas().equals(whole[name].to_pandas()), name
    assert whole["is_corrupted"].to_pylist() == [i in (3, 7) for i in range(12)]
    assert np.isnan(pc.list_flatten(whole["loss"]).to_numpy()[0])


def test_written_by_row_groups_equals_the_table_built_at_once(tmp_path, tiny_dataset, monkeypatch):
    """write_dossier streams a row group per chunk of rows (two indices: the groups of each, then
    joined under one schema): read back, it is build_dossier's table, metadata and all; no part
    file is left, and a killed writer's part is removed by the next write."""
    import pyarrow.parquet as pq

    from epochlens.samples.dossier_file import write_dossier

    inputs = _inputs(tmp_path, tiny_dataset)
    inputs.outputs = {0: tmp_path / "outputs.npz", 3: tmp_path / "outputs.npz"}
    monkeypatch.setattr(dossier, "ROWS", 5)
    whole = build_dossier(inputs)
    (tmp_path / "out").mkdir()
    orphan = tmp_path / "out" / ".dossier.parquet.pid999999999-part0"
    orphan.write_bytes(b"left by a killed job")
    written = write_dossier(inputs, tmp_path / "out" / "dossier.parquet")
    assert written == {"train": 24, "columns": whole.num_columns}
    file = pq.ParquetFile(tmp_path / "out" / "dossier.parquet")
    assert [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)] == [5, 5, 2] * 2
    back = file.read()
    pq.write_table(whole, tmp_path / "whole.parquet")  # as the dossier was written before
    assert back.schema.equals(pq.read_schema(tmp_path / "whole.parquet"), check_metadata=True)
    for name in whole.column_names:
        assert back[name].to_pandas().equals(whole[name].to_pandas()), name
    assert back["index"].to_pylist() == [0] * 12 + [3] * 12
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dossier.parquet"]


def test_series_read_by_columns_equal_the_arrays(tmp_path):
    """NpzColumns reads array[..., lo:hi] of the members np.savez stored, and of compressed ones."""
    from epochlens.samples.series_rows import NpzColumns

    rng = np.random.default_rng(1)
    arrays = {"epochs": np.arange(3), "loss": rng.random((3, 1000)), "correct": rng.random((3, 1000)) > 0.5}
    arrays["loss"][1, 7] = np.nan
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", **arrays)
        npz = NpzColumns(tmp_path / "a.npz")
        assert sorted(npz.files) == sorted(arrays) and npz.shape("loss") == (3, 1000)
        for key, values in arrays.items():
            np.testing.assert_array_equal(npz.whole(key), values)
            np.testing.assert_array_equal(npz.columns(key, 5, 900), values[..., 5:900])
            np.testing.assert_array_equal(npz.columns(key, 990, 2000), values[..., 990:])


def test_a_row_of_a_series_is_read_alone(tmp_path):
    """NpzColumns.row reads one checkpoint's values (the dossier's final loss), stored or compressed."""
    from epochlens.samples.series_rows import NpzColumns

    loss = np.random.default_rng(2).random((4, 300))
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", loss=loss)
        npz = NpzColumns(tmp_path / "a.npz")
        np.testing.assert_array_equal(npz.row("loss", -1), loss[-1])
        np.testing.assert_array_equal(npz.row("loss", 1), loss[1])
