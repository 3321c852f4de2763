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
