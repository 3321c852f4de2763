"""The results layout: the paths users have on disk (DESIGN.md), values and wildcards alike."""

from __future__ import annotations

import pytest

from epochlens.layout import (
    RESULTS,
    Layout,
    epoch_name,
    index_name,
    representation_file,
    representation_name,
    shard_name,
)


def test_paths_of_one_checkpoint_are_the_documented_ones():
    L = RESULTS
    assert L.dataset("r") == "results/r/data/dataset.h5"
    assert L.corrupted_indices("r") == "results/r/data/corrupted_indices.npy"
    assert L.class_order("r", 2) == "results/r/index-2/class_order.npy"
    assert L.checkpoint("r", 0, 40) == "results/r/index-0/checkpoints/epoch_0040.pt"
    assert L.train_log("r", 1) == "results/r/index-1/train_log.csv"
    assert L.train_metadata("r", 1) == "results/r/index-1/train_metadata.json"
    assert L.eval_table("r", 0, 3) == "results/r/index-0/eval/epoch_0003.csv"
    assert L.curvature_array("curvature", "r", 0, 200) == (
        "results/r/index-0/curvature/epoch_0200/per_image_curvature.npy"
    )
    assert L.curvature_metadata("r", 0, 200) == "results/r/index-0/curvature/epoch_0200/metadata.json"
    assert L.curvature_shard("r", 0, 4000, 1, 3) == (
        "results/r/index-0/curvature/epoch_4000/shards/shard_1-of-3.npz"
    )
    assert L.features("r", 1, 15) == "results/r/index-1/features/epoch_0015.h5"
    assert L.probe_table("r", 1, 15) == "results/r/index-1/probes/epoch_0015.csv"
    assert L.ablation_table("r", 1, 15) == "results/r/index-1/ablation/epoch_0015.csv"
    assert L.influence_file("scores.npz", "r", 0, 75, "ekfac") == (
        "results/r/index-0/influence/epoch_0075/ekfac/scores.npz"
    )
    assert L.table("poison_detection", "r") == "results/r/tables/poison_detection.csv"
    assert L.table_provenance("accuracy_tables", "r") == "results/r/tables/accuracy_tables.provenance.json"
    assert L.figures("probe_accuracy", "r") == [
        "results/r/figures/probe_accuracy.png",
        "results/r/figures/probe_accuracy.pdf",
    ]


def test_logs_and_benchmarks_are_named_after_the_job():
    L = RESULTS
    assert L.log("prepare_data", "r") == "results/r/logs/prepare_data.log"
    assert L.log("class_order", "r", 1) == "results/r/logs/class_order/index-1.log"
    assert L.log("evaluate", "r", 0, 9) == "results/r/logs/evaluate/index-0/epoch_0009.log"
    assert L.log("curvature", "r", 0, 9, shard_name(0, 2)) == (
        "results/r/logs/curvature/index-0/epoch_0009/shard_0-of-2.log"
    )
    assert L.benchmark("influence", "r", 0, 75, "kfac/factors") == (
        "results/r/benchmarks/influence/index-0/epoch_0075/kfac/factors.tsv"
    )


def test_wildcards_are_the_defaults_and_stay_wildcards():
    L = RESULTS
    assert L.eval_table() == "results/{run}/index-{index}/eval/epoch_{epoch}.csv"
    assert L.curvature_shard() == (
        "results/{run}/index-{index}/curvature/epoch_{epoch}/shards/shard_{shard}-of-{nshards}.npz"
    )
    assert L.influence_file("factors.pt") == (
        "results/{run}/index-{index}/influence/epoch_{epoch}/{method}/factors.pt"
    )
    assert L.log("train", "{run}", "{index}") == "results/{run}/logs/train/index-{index}.log"
    # a concrete run with wildcard index (the per-run training rules)
    assert L.class_order("digits") == "results/digits/index-{index}/class_order.npy"


@pytest.mark.parametrize("epoch", [40, "40", "0040", "00040"])
def test_an_epoch_is_formatted_once_whatever_its_spelling(epoch):
    assert epoch_name(epoch) == "epoch_0040"
    assert RESULTS.features("r", "0", epoch) == RESULTS.features("r", 0, 40)


def test_other_roots_and_large_epochs():
    assert Layout("/data/out").dataset("r") == "/data/out/r/data/dataset.h5"
    assert epoch_name(12345) == "epoch_12345" and index_name("3") == "index-3"


@pytest.mark.parametrize("name", ["mean", "spectral", "userreps.reps:top2", "a.b_c.d:f.g"])
def test_a_stored_run_has_a_file_per_representation_named_back_to_it(name):
    file = representation_file(name)
    assert ":" not in file and representation_name(file) == name
    assert RESULTS.stored_features("r", 0, 3, name) == f"results/r/index-0/features/epoch_0003/{file}.h5"
    assert RESULTS.stored_probe_table("r", 0, 3, name) == f"results/r/index-0/probes/epoch_0003/{file}.csv"
    assert RESULTS.stored_features() == (
        "results/{run}/index-{index}/features/epoch_{epoch}/{representation}.h5"
    )
