"""epochlens.memory: each job's mem_mb from the shapes of its run's files."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from epochlens import memory
from epochlens.data import write_dataset
from epochlens.memory import HEADROOM, RunShape, job_mem_mb, job_shape, mem_mb, rule_memory


def _images_h5(path, n_train, n_test, shape=(3, 32, 32)):
    """A dataset.h5's image arrays of these sizes (allocated lazily: no pixels written)."""
    with h5py.File(path, "w") as f:
        for split, n in (("train", n_train), ("test", n_test)):
            images = f.create_group(split)
            images.create_dataset("images", shape=(n, *shape), dtype="uint8", chunks=(256, *shape))
    return path


def test_shape_read_from_the_written_dataset(tmp_path, tiny_dataset):
    write_dataset(tiny_dataset, tmp_path / "dataset.h5")
    torch.save(torch.nn.Linear(100, 10).state_dict(), tmp_path / "ckpt.pt")
    shape = job_shape({"dataset": str(tmp_path / "dataset.h5"), "checkpoint": str(tmp_path / "ckpt.pt")})
    n = len(tiny_dataset.train_labels) + len(tiny_dataset.test_labels)
    assert shape.samples == n
    assert shape.sample_bytes == tiny_dataset.train_images[0].nbytes
    assert shape.model_bytes == (tmp_path / "ckpt.pt").stat().st_size > 1010 * 4


def test_damaged_files_count_as_empty(tmp_path):
    """Planning does not stop on a damaged dataset.h5 or dossier: the job asks its fixed cost, and
    its own read names the file and the fix."""
    (tmp_path / "dataset.h5").write_bytes(b"not hdf5")
    (tmp_path / "dossier.parquet").write_bytes(b"not parquet")
    assert job_shape({"dataset": str(tmp_path / "dataset.h5")}) == RunShape()
    assert job_shape({"dossier": str(tmp_path / "dossier.parquet")}) == RunShape()


def test_files_not_made_yet_count_as_empty(tmp_path):
    """Planning: the dataset and checkpoints do not exist yet (the job is asked again later)."""
    shape = job_shape({"dataset": str(tmp_path / "no.h5"), "checkpoints": [str(tmp_path / "no.pt")]})
    assert shape == RunShape()
    rule = "sample_outputs_shard"
    assert mem_mb(rule, shape) == round(rule_memory(rule).base_mb * HEADROOM)


PER_SAMPLE = ["sample_outputs_shard", "sample_dossier", "sample_explorer", "evaluate_checkpoint"]


def _per_sample(rule: str) -> float:
    """Bytes a sample of a job of ``rule`` with no run config: a scoring job's scores of the
    schema's default 50 queries, one transform, too."""
    return rule_memory(rule).per_sample + 50 * rule_memory(rule).per_score


@pytest.mark.parametrize("rule", PER_SAMPLE)
def test_resources_grow_with_n(tmp_path, rule):
    """The per-sample jobs ask for more as the data set grows (by what they hold per sample), and
    twice as much at their second attempt."""
    small = {"dataset": str(_images_h5(tmp_path / "small.h5", 10_000, 10_000))}
    large = {"dataset": str(_images_h5(tmp_path / "large.h5", 1_000_000, 10_000))}
    assert job_mem_mb(rule, small) < job_mem_mb(rule, large)
    held_mb = _per_sample(rule) * 990_000 / memory.MB
    assert job_mem_mb(rule, large) - job_mem_mb(rule, small) == pytest.approx(held_mb * HEADROOM, abs=2)
    assert job_mem_mb(rule, large, attempt=2) == pytest.approx(2 * job_mem_mb(rule, large), abs=2)


def test_prepare_data_grows_with_its_source_and_the_model_term_with_the_checkpoint(tmp_path):
    source = tmp_path / "cifar-100-python"
    source.mkdir()
    (source / "train").write_bytes(np.zeros(30_000_000, np.uint8).tobytes())
    shape = job_shape({"source": [str(source)]})
    assert shape.input_bytes == 30_000_000
    assert mem_mb("prepare_data", shape) > mem_mb("prepare_data", RunShape())
    big = RunShape(model_bytes=500_000_000)
    grown = mem_mb("curvature_shard", big) - mem_mb("curvature_shard", RunShape())
    assert grown == pytest.approx(rule_memory("curvature_shard").model_copies * 500 * HEADROOM, abs=2)


def test_rules_not_listed_get_the_default():
    assert rule_memory("plot_accuracy") is memory.DEFAULT
    assert rule_memory("sample_outputs") is not memory.DEFAULT


def test_a_data_folder_is_sized_by_what_prepare_data_holds_of_it(tmp_path, monkeypatch):
    """A data folder is a param of prepare_data, not its input: its memory counts an image folder's
    images decoded (the size the config asks for, or the first image's) and another folder's files."""
    from PIL import Image

    from epochlens.data import stats
    from epochlens.memory_sources import data_folder_bytes

    for split, n in (("train", 6), ("test", 2)):
        for i in range(n):
            (tmp_path / "images" / split / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (20, 16), (i, 0, 0)).save(tmp_path / "images" / split / f"c{i % 2}" / f"{i}.png")
    folder = {"source": "imagefolder", "path": str(tmp_path / "images")}
    assert data_folder_bytes(folder) == 8 * 3 * 20 * 16  # decoded, not the PNGs' bytes
    monkeypatch.setattr(stats, "WHOLE_VALUES", 1000)
    assert data_folder_bytes(folder) == 2000  # more goes to disk, not memory (epochlens.data.blocks)
    monkeypatch.undo()
    assert data_folder_bytes({**folder, "images": {"size": 8}}) == 8 * 3 * 64
    assert data_folder_bytes({**folder, "images": {"size": [4, 5], "channels": "L"}}) == 8 * 20
    (tmp_path / "table").mkdir()
    (tmp_path / "table" / "train.parquet").write_bytes(b"x" * 1000)
    assert data_folder_bytes({"source": "parquet", "path": str(tmp_path / "table")}) == 1000
    assert data_folder_bytes({"source": "npz", "path": str(tmp_path / "d.npz")}) == 0  # an input
    assert data_folder_bytes({"source": "imagefolder", "path": str(tmp_path / "not_yet")}) == 0
    big = job_mem_mb("prepare_data", {}, folder_bytes=3_000_000_000)
    assert big - job_mem_mb("prepare_data", {}) == pytest.approx(3000 * HEADROOM, abs=2)


def test_an_npz_source_counts_the_arrays_prepare_data_reads_whole(tmp_path, monkeypatch):
    """A large array np.savez stored is read by rows (epochlens.data.stored_npz): prepare_data's
    memory leaves it out; a compressed one, read whole, counts whole."""
    from epochlens.data import stats

    monkeypatch.setattr(stats, "WHOLE_VALUES", 1000)
    arrays = {"x_train": np.zeros((100, 3, 4, 4), np.uint8), "y_train": np.zeros(100, np.int64)}
    arrays.update(x_test=np.zeros((10, 3, 4, 4), np.uint8), y_test=np.zeros(10, np.int64))
    np.savez(tmp_path / "stored.npz", **arrays)
    np.savez_compressed(tmp_path / "packed.npz", **arrays)
    size = (tmp_path / "stored.npz").stat().st_size
    assert job_shape({"source": [str(tmp_path / "stored.npz")]}).input_bytes == size - 100 * 48
    packed = tmp_path / "packed.npz"
    assert job_shape({"source": [str(packed)]}).input_bytes == packed.stat().st_size
    assert job_shape({"shards": [str(tmp_path / "stored.npz")]}).input_bytes == size  # a merge reads all


def test_a_text_runs_tables_count_once(tmp_path):
    """prepare_data of a text run reads its tables a chunk at a time: a folder of them counts its
    files' bytes once (what the job holds of a million sentences, measured, stays below them)."""
    from epochlens.memory_sources import data_folder_bytes

    folder = tmp_path / "sst"
    folder.mkdir()
    for split, n in (("train", 9000), ("test", 1000)):
        (folder / f"{split}.jsonl").write_text('{"sentence": "a b c", "label": 1}\n' * n)
    data = {"source": "jsonl", "path": str(folder), "text": {}}
    assert data_folder_bytes(data) == sum(p.stat().st_size for p in folder.iterdir())
    assert data_folder_bytes({"source": "polarity"}) == 0


@pytest.mark.parametrize("rule", ["sample_outputs_shard", "curvature_shard", "influence_score_shard"])
def test_a_shard_job_asks_for_its_share_of_the_samples(tmp_path, rule):
    """A shard of S holds 1/S of what the job holds per sample (its model and fixed cost whole)."""
    inputs = {"dataset": str(_images_h5(tmp_path / "large.h5", 1_000_000, 10_000))}
    whole, quarter = job_mem_mb(rule, inputs), job_mem_mb(rule, inputs, share=1 / 4)
    held_mb = _per_sample(rule) * 1_010_000 / memory.MB
    assert whole - quarter == pytest.approx(held_mb * 3 / 4 * HEADROOM, abs=2)
    assert quarter > mem_mb(rule, RunShape())


def test_an_influence_job_of_a_large_model_asks_for_its_layer_groups_not_16_copies(tmp_path):
    """A 29 GB checkpoint (a 7B model in float32): 16 copies would be 464 GB; the run's budgets
    bound the factors and held queries (scale_plan.influence_cap); a small model keeps 16 copies."""
    big, small = tmp_path / "big.safetensors", tmp_path / "small.pt"
    with open(big, "wb") as f:
        f.truncate(29_000_000_000)  # sparse: no disk used
    small.write_bytes(b"\0" * 45_000_000)  # a ResNet-18
    run = {"influence": {"factor_memory_gb": 24, "query_memory_gb": 8}}
    capped = job_mem_mb("influence_factors", {"checkpoint": str(big)}, run=run)
    cap_mb = (3 * 29e9 + (1.5 * 24 + 8) * 2**30) / memory.MB
    assert capped == pytest.approx((rule_memory("influence_factors").base_mb + cap_mb) * HEADROOM, abs=2)
    assert job_mem_mb("influence_factors", {"checkpoint": str(big)}) > 16 * 29_000 * HEADROOM
    for rule in ("influence_factors", "influence_scores"):
        assert job_mem_mb(rule, {"checkpoint": str(small)}, run=run) == job_mem_mb(
            rule, {"checkpoint": str(small)}
        )
    assert job_mem_mb("curvature_shard", {"checkpoint": str(big)}, run=run) > 12 * 29_000  # influence only


#: Own peaks (ru_maxrss, MB) measured by ``benchmarks/scale.py --sizes 20000 --stages influence
#: --model small_cnn --source npz --queries Q --pairwise-gb 100`` (logra alone, scores whole; the
#: shape: 30,000 samples, train and test), 2026-12-07, before the scores counted in mem_mb.
MEASURED = {
    1000: {"influence_store_scores": 943, "poison_detection": 825, "sample_dossier": 866},
    5000: {"influence_store_scores": 2850, "poison_detection": 3717, "sample_dossier": 3758},
}


@pytest.mark.parametrize("queries", sorted(MEASURED))
def test_scoring_jobs_and_their_readers_ask_for_the_scores_they_hold(queries):
    """The store's scoring job and the tables that read its scores asked for 1,114 and ~360 MB
    whatever the queries; the measured peaks are below what they ask now."""
    run = {"influence": {"methods": ["logra"], "queries": {"max_count": queries}, "transforms": ["none"]}}
    run["influence"]["projection"] = {"pairwise_gb": 100}
    shape = memory.influence_shape(RunShape(samples=30_000), run["influence"])
    for rule, peak in MEASURED[queries].items():
        assert peak < mem_mb(rule, shape) < 2.5 * peak, rule


def test_scores_past_pairwise_gb_are_asked_for_as_a_summary_where_every_method_is_projected():
    """1,000 queries x 2 transforms x 1,000,000 samples: 8 GB of float32 scores. Past pairwise_gb
    the store's job and its readers hold a summary; a factor method in the run keeps them whole."""
    shape = RunShape(samples=1_000_000)
    logra = {"methods": ["logra"], "queries": {"max_count": 1000}, "transforms": ["none", "hflip"]}
    small = memory.influence_shape(shape, {**logra, "projection": {"pairwise_gb": 2}})
    whole = memory.influence_shape(shape, {**logra, "projection": {"pairwise_gb": 10}})
    mixed = {**logra, "methods": ["ekfac", "logra"], "projection": {"pairwise_gb": 2}}
    mixed = memory.influence_shape(shape, mixed)
    scores_mb = 2000 * 1_000_000 * 18 / memory.MB * HEADROOM
    for rule in ("influence_store_scores", "poison_detection", "sample_dossier"):
        assert mem_mb(rule, small) == mem_mb(rule, shape) < mem_mb(rule, whole) == mem_mb(rule, mixed)
        assert mem_mb(rule, small) < 3_000 and mem_mb(rule, whole) > scores_mb
    assert mem_mb("influence_scores", small) > scores_mb  # a factor method's are always whole
    assert mem_mb("lds_tables", small) > scores_mb  # the LDS reads them whole


#: max_rss (MB) of trak's jobs on the demo's digits_noisy (1,797 images, 50 queries x 4 transforms)
#: at two projection sizes, from Snakemake's benchmark files, 2026-12-07: its one k x k curvature.
MEASURED_TRAK = {
    2048: {"influence_store_shard": 319, "influence_store_eigen": 462, "influence_store_scores": 433},
    8192: {"influence_store_shard": 1327, "influence_store_eigen": 3832, "influence_store_scores": 1878},
}


def test_trak_jobs_ask_for_their_curvature():
    """Below each measured peak, growing from k = 2,048 to 8,192 by more than the peaks grew (the
    eigendecomposition asked 600 MB at both before); a logra job of the same run asks for none."""
    spec = {
        "methods": ["logra", "trak"],
        "queries": {"max_count": 50},
        "transforms": ["none", "hflip", "noise", "crop"],
    }
    shape, asked = RunShape(samples=1797, model_bytes=103_207), {}
    for k, peaks in MEASURED_TRAK.items():
        trak = memory.influence_shape(shape, {**spec, "projection": {"trak_dim": k}}, "trak")
        asked[k] = {rule: mem_mb(rule, trak) for rule in peaks}
        assert all(peak < asked[k][rule] for rule, peak in peaks.items()), (k, asked[k])
        logra = memory.influence_shape(shape, {**spec, "projection": {"trak_dim": k}}, "logra")
        assert mem_mb("influence_store_eigen", logra) == mem_mb("influence_store_eigen", shape)
    for rule in MEASURED_TRAK[2048]:
        assert asked[8192][rule] - asked[2048][rule] > MEASURED_TRAK[8192][rule] - MEASURED_TRAK[2048][rule]
    assert "trak_dim²" in memory.describe("influence_store_eigen")
