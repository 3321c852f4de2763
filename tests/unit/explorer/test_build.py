"""The explorer's files against the dossier they come from: scalar columns, series, neighbour rows,
strings, the detectors' AUROC (exact on a tiny case), the errors a user sees, and the server."""

from __future__ import annotations

import json
import threading
import urllib.request

import numpy as np
import pyarrow as pa
import pytest
from tiny_dossier import EPOCHS, write_tiny_dossier

from epochlens.errors import DataError
from epochlens.explorer.build import build_explorer
from epochlens.explorer.serve import address, explorer_folder, make_server


def _load(out, manifest, name):
    c = next(c for c in manifest["columns"] if c["name"] == name)
    return c, np.fromfile(out / c["file"], dtype=c["dtype"])


def _row(out, manifest, row):
    size, width = manifest["chunk_size"], manifest["layout"]["width"]
    chunk = np.fromfile(out / f"chunks/{row // size}.bin", dtype=np.float32).reshape(-1, width)
    return chunk[row % size]


def test_columns_and_rows_match_thewrite_tiny_dossier(tmp_path):
    out = tmp_path / "explorer"
    m = build_explorer(write_tiny_dossier(tmp_path / "dossier.parquet"), out)
    assert m["n_rows"] == 5 and m["epochs"] == EPOCHS
    c, conf = _load(out, m, "confidence")
    assert c["kind"] == "number"
    np.testing.assert_array_equal(conf, np.array([0.6, 0.2, np.nan, np.nan, 0.5], np.float32))
    c, role = _load(out, m, "role")
    assert [c["categories"][k] for k in role] == ["train", "train", "query", "query", "train"]
    c, flag = _load(out, m, "is_corrupted")
    assert c["categories"] == ["false", "true"] and list(flag) == [0, 1, c["null"], c["null"], 0]
    strings = json.loads((out / "chunks/0.json").read_text())
    assert strings["text"][1] == "cf bad film" and strings["id"] == ["a", "b", "q0", "q1", "a"]
    assert {"id", "text"} == set(m["strings"])


def test_series_and_neighbours_in_the_chunks(tmp_path):
    out = tmp_path / "explorer"
    m = build_explorer(write_tiny_dossier(tmp_path / "dossier.parquet"), out)
    layout = m["layout"]
    loss = next(s for s in layout["series"] if s["name"] == "loss")["offset"]
    np.testing.assert_array_equal(_row(out, m, 1)[loss : loss + 3], [2.0, np.nan, 3.0])
    assert np.isnan(_row(out, m, 2)[loss : loss + 3]).all()  # a query: no series
    correct = next(s for s in layout["series"] if s["name"] == "correct")["offset"]
    np.testing.assert_array_equal(_row(out, m, 0)[correct : correct + 3], [0, 1, 1])
    prop = next(n for n in layout["neighbours"] if n["name"] == "proponents_ekfac")
    assert prop["role"] == "query" and prop["k"] == 2
    r0 = _row(out, m, 0)
    # train 0 of index 0: queries 1 and 0 of index 0 are rows 3 and 2
    np.testing.assert_array_equal(r0[prop["offset"] : prop["offset"] + 4], [3, 2, 0.5, 0.25])
    # index 1's train 0 names query 0 of index 1, which the dossier does not have: no row
    np.testing.assert_array_equal(_row(out, m, 4)[prop["offset"] : prop["offset"] + 2], [-1, -1])
    top = next(n for n in layout["neighbours"] if n["name"] == "top_train_ekfac")
    np.testing.assert_array_equal(_row(out, m, 2)[top["offset"] : top["offset"] + 2], [1, 0])


def test_auroc_of_each_detector_is_exact(tmp_path):
    m = build_explorer(write_tiny_dossier(tmp_path / "dossier.parquet"), tmp_path / "explorer")
    (curve,) = m["roc"]["curves"]
    # trained rows only (the holdout's 0.95 is left out): 0.9 (corrupted) over 0.1 (clean)
    assert curve["name"] == "loss_score" and curve["auroc"] == 1.0
    assert (curve["n_positive"], curve["n_negative"]) == (1, 1)
    table = write_tiny_dossier(tmp_path / "all_trained.parquet", split=False)
    (curve,) = build_explorer(table, tmp_path / "explorer2")["roc"]["curves"]
    # without a split column every training row counts: 1 of the 2 pairs ranked right
    assert curve["auroc"] == 0.5 and (curve["n_positive"], curve["n_negative"]) == (1, 2)
    assert m["default"]["color"] == "is_corrupted" and m["default"]["filters"] == {"role": ["train"]}


def test_bad_dossiers_say_what_to_do(tmp_path):
    with pytest.raises(DataError, match="no dossier.*rule sample_dossier"):
        build_explorer(tmp_path / "missing.parquet", tmp_path / "explorer")
    with pytest.raises(DataError, match="'epochlens' metadata"):
        build_explorer(write_tiny_dossier(tmp_path / "plain.parquet", meta=False), tmp_path / "explorer")
    rows = {
        "index": pa.array([0], pa.int32()),
        "role": ["train"],
        "position": pa.array([0], pa.int64()),
        "confidence": [0.5],
        "loss": pa.array([[1.0, 2.0]], pa.list_(pa.float32())),
    }
    with pytest.raises(DataError, match="'loss': row 0 holds 2 values for 3 epochs"):
        build_explorer(write_tiny_dossier(tmp_path / "short.parquet", rows=rows), tmp_path / "explorer")
    assert not (tmp_path / "explorer").exists()  # nothing half written


def test_served_on_localhost_and_built_when_missing(tmp_path, capsys):
    run = tmp_path / "results/tiny"
    (run / "samples").mkdir(parents=True)
    write_tiny_dossier(run / "samples/dossier.parquet")
    folder = explorer_folder("tiny", tmp_path / "results")
    assert folder == run / "samples/explorer" and (folder / "index.html").is_file()
    assert "building" in capsys.readouterr().out
    server = make_server(folder, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = address(server)
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "manifest.json") as r:
            assert json.load(r)["run"] == "tiny"
        with urllib.request.urlopen(url) as r:
            assert b"explorer.js" in r.read()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(DataError, match="snakemake .*other/samples/explorer"):
        explorer_folder("other", tmp_path / "results")


def test_thumbnail_sheets_are_copied_with_the_page_once_each(tmp_path):
    (tmp_path / "thumbs").mkdir()
    rows = {
        "index": pa.array([0, 0, 0], pa.int32()),
        "role": ["train", "train", "train"],
        "position": pa.array([0, 1, 2], pa.int64()),
        "image": ["thumbs/train_0.png#xywh=0,0,8,8", "thumbs/train_0.png#xywh=8,0,8,8", "thumbs/train_1.png"],
        "confidence": [0.5, 0.75, 0.25],
    }
    for k in (0, 1):
        (tmp_path / f"thumbs/train_{k}.png").write_bytes(b"png %d" % k)
    m = build_explorer(write_tiny_dossier(tmp_path / "dossier.parquet", rows=rows), tmp_path / "explorer")
    assert m["strings"] == ["image"]
    assert sorted(p.name for p in (tmp_path / "explorer/thumbs").iterdir()) == ["train_0.png", "train_1.png"]
    assert (tmp_path / "explorer/thumbs/train_1.png").read_bytes() == b"png 1"
    rows["image"] = ["../elsewhere.png", None, None]
    with pytest.raises(DataError, match="'../elsewhere.png' is not relative to the dossier's folder"):
        build_explorer(write_tiny_dossier(tmp_path / "bad.parquet", rows=rows), tmp_path / "explorer")
    assert (tmp_path / "explorer/thumbs/train_1.png").exists()  # the earlier explorer, kept whole
    assert not (tmp_path / "explorer.partial").exists()


def test_a_multi_output_regressions_target_is_text_not_a_series(tmp_path):
    """A regression's target of 4 values per sample (the dossier's list column ``target``) is the
    sample's values, not a series across checkpoints: shown as text (a training command's run of
    4 outputs failed the build, 'holds 4 values for 3 epochs')."""
    rows = {
        "index": pa.array([0, 0], pa.int32()),
        "role": ["train", "train"],
        "position": pa.array([0, 1], pa.int64()),
        "target": pa.array([[0.5, -1.25, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]], pa.list_(pa.float64())),
        "epochs": pa.array([EPOCHS, EPOCHS], pa.list_(pa.int32())),
        "loss": pa.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.125]], pa.list_(pa.float32())),
    }
    out = tmp_path / "explorer"
    m = build_explorer(write_tiny_dossier(tmp_path / "regression.parquet", rows=rows), out)
    assert "target" in m["strings"] and [s["name"] for s in m["layout"]["series"]] == ["loss"]
    strings = json.loads((out / "chunks/0.json").read_text())
    assert strings["target"] == ["0.5, -1.25, 2, 0", "1, 1, 1, 1"]


def test_a_dossier_of_many_row_groups_gives_the_same_explorer(tmp_path):
    """The explorer reads the dossier by columns and row groups: a file of row groups of 2 rows
    gives the files of one written whole, and row chunks cut across the row groups."""
    import filecmp

    import pyarrow.parquet as pq

    from epochlens.explorer.chunks import row_chunks

    whole = write_tiny_dossier(tmp_path / "whole.parquet")
    table = pq.read_table(whole)
    pq.write_table(table, tmp_path / "groups.parquet", row_group_size=2)
    assert pq.ParquetFile(tmp_path / "groups.parquet").num_row_groups == 3
    a = build_explorer(whole, tmp_path / "a")
    b = build_explorer(tmp_path / "groups.parquet", tmp_path / "b")
    assert a == b
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and all(filecmp.cmp(tmp_path / "a" / f, tmp_path / "b" / f, shallow=False) for f in files)
    chunks = list(row_chunks(pq.ParquetFile(tmp_path / "groups.parquet"), ["id", "loss"], 3))
    assert [c.num_rows for c in chunks] == [3, 2]
    assert [i for c in chunks for i in c["id"].to_pylist()] == table["id"].to_pylist()
