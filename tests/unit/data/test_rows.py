"""A dataset.h5 read by rows (epochlens.data.rows): the same numbers as the whole file read at once,
only the chunks that hold the rows asked for, and a damaged chunk named when it is read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochlens.data import Dataset, read_dataset, write_dataset
from epochlens.data.rows import NormalizedRows, RowReader, open_dataset
from epochlens.errors import DataError


def _dataset(n: int = 1000, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset(
        name="rows",
        source="test",
        train_images=rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8),
        train_labels=rng.integers(0, 10, n),
        test_images=rng.integers(0, 256, (200, 3, 8, 8), dtype=np.uint8),
        test_labels=rng.integers(0, 10, 200),
        num_classes=10,
        scale=1 / 255,
        mean=(0.5, 0.4, 0.3),
        std=(0.2, 0.25, 0.3),
        holdout=np.arange(n) < 30,
    )


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "dataset.h5"
    write_dataset(_dataset(), path)
    return path


def test_rows_equal_the_whole_file(stored):
    whole, rows = read_dataset(stored), open_dataset(stored)
    assert isinstance(rows.train_images, RowReader)
    assert rows.content_hash == whole.content_hash
    assert np.array_equal(np.asarray(rows.train_images), whole.train_images)
    rng = np.random.default_rng(1)
    for idx in (
        np.arange(256, 700),  # a contiguous run across chunks
        np.sort(rng.choice(1000, 300, replace=False)),  # scattered
        rng.integers(0, 1000, 50),  # any order, repeats
        np.array([-1, 0, -1000]),  # counted from the end, as numpy does
        np.zeros(0, np.int64),
    ):
        for split in ("train", "test"):
            idx_s = idx % 200 if split == "test" else idx
            assert torch.equal(rows.normalized(split, idx_s), whole.normalized(split, idx_s))
    assert torch.equal(rows.normalized("test"), whole.normalized("test"))
    assert np.array_equal(rows.train_images[10:20], whole.train_images[10:20])
    assert np.array_equal(rows.train_images[-3], whole.train_images[-3])
    with pytest.raises(IndexError, match="out of range"):
        rows.train_images[np.array([1000])]


def test_normalized_rows_read_a_batch_at_a_time(stored):
    data = read_dataset(stored)
    lazy = NormalizedRows(open_dataset(stored), "train")
    picked = lazy.select(np.array([5, 900, 17, 400]))  # reads nothing
    assert isinstance(picked, NormalizedRows) and picked.shape == (4, 3, 8, 8)
    assert torch.equal(picked[1:3], data.normalized("train", np.array([900, 17])))
    assert torch.equal(picked[torch.tensor([3, 0])], data.normalized("train", np.array([400, 5])))
    assert torch.equal(lazy[:], data.normalized("train"))


def _damage_chunk(path, key: str, chunk: int) -> None:
    """Overwrite the stored (compressed) bytes of one chunk of ``key`` with zeros."""
    import h5py

    with h5py.File(path, "r") as f:
        info = f[key].id.get_chunk_info(chunk)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 8)
        fh.write(bytes(info.size - 16))


def test_a_job_reads_only_its_rows(tmp_path):
    """Rows in intact chunks read from a file whose last chunk is damaged: nothing else is read.
    Reading the damaged rows (or the whole file, as read_dataset does) names the file and the fix."""
    path = tmp_path / "dataset.h5"
    write_dataset(_dataset(), path)  # chunks of 256 rows: rows 768..999 are the fourth
    _damage_chunk(path, "train/images", 3)
    data = open_dataset(path)
    expected = _dataset()
    rows = np.arange(0, 700, 7)
    assert np.array_equal(data.train_images[rows], expected.train_images[rows])
    assert np.array_equal(data.train_labels, expected.train_labels)
    with pytest.raises(DataError, match=r"dataset.h5.*damaged.*prepare_data"):
        data.normalized("train", np.array([10, 800]))
    with pytest.raises(DataError, match="prepare_data"):
        read_dataset(path)


def test_an_incomplete_file_names_the_fix(tmp_path):
    path = tmp_path / "dataset.h5"
    path.write_bytes(b"not hdf5")
    with pytest.raises(DataError, match=r"dataset.h5: not a complete.*prepare_data"):
        open_dataset(path)


def test_a_copy_with_other_images_is_hashed_again(stored):
    import dataclasses

    data = open_dataset(stored)
    other = dataclasses.replace(data, test_images=np.zeros((200, 3, 8, 8), np.uint8))
    assert other.content_hash != data.content_hash
    whole = dataclasses.replace(read_dataset(stored), test_images=other.test_images)
    assert other.content_hash == whole.content_hash


def test_the_evaluation_job_reads_only_its_rows(tmp_path):
    """A checkpoint job on a data set whose last training chunk is damaged: the evaluation (the
    test split and the holdout, rows 0..29) runs and equals the one on the intact data set; the
    job used to read and hash the whole file first, and stopped."""
    from epochlens.evaluation import evaluate_checkpoint
    from epochlens.job import load_checkpoint_job
    from epochlens.models.networks import build_model
    from epochlens.schedule import ClassSchedule

    write_dataset(_dataset(), tmp_path / "intact.h5")
    write_dataset(_dataset(), tmp_path / "dataset.h5")
    _damage_chunk(tmp_path / "dataset.h5", "train/images", 3)
    torch.save(build_model("small_cnn", 10, 3, seed=0).state_dict(), tmp_path / "model.pt")
    schedule = ClassSchedule(np.arange(10), 5, 5, 10)
    tables = []
    for name in ("intact.h5", "dataset.h5"):
        job = load_checkpoint_job(tmp_path / name, tmp_path / "model.pt", "small_cnn", 10)
        tables.append(evaluate_checkpoint(job.model, job.data, schedule, 10))
    assert set(tables[1]["split"]) == {"test", "holdout"}
    assert tables[0].equals(tables[1])
