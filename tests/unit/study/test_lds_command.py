"""LDS of a run whose training is the user's command (epochlens.study.retrain_command) and of a
regression (epochlens.study.lds on ``test_losses``).

Ground truth for the regression tables: least squares, where retraining on a subset has a closed
form and the exact influence s_qn = g_qᵀ H⁻¹ g_n is known in closed form too; the tables read
from hand-made retraining parts and scores files must give LDS near 1 for those scores and near
−1 for their negation (the sign convention of the package's scores: positive helps the query).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from quality import SEED, above, below

from epochlens.formats.command import CommandError, CommandSpec
from epochlens.study.lds import Retrainings, lds_tables, read_parts
from epochlens.study.retrain import part_subsets, subset_masks
from epochlens.study.retrain_command import CommandRetraining, remove_subset_folders, retrain_part_by_command


def least_squares(n: int = 200, d: int = 5, k: int = 2, n_test: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * np.array([3.0, 1.0, 0.5, 0.3, 0.1])
    w_true = rng.standard_normal((k, d))
    y = x @ w_true.T + 0.5 * rng.standard_normal((n, k))
    xt = rng.standard_normal((n_test, d))
    yt = xt @ w_true.T + 0.5 * rng.standard_normal((n_test, k))
    return x, y, xt, yt


def solve(x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> np.ndarray:
    xs, ys = x[rows], y[rows]
    return np.linalg.solve(xs.T @ xs, xs.T @ ys).T  # (k, d)


def exact_scores(x, y, xq, yq) -> np.ndarray:
    """(Q, N) g_qᵀ H⁻¹ g_n of the summed squared error ‖W x − y‖² at the full-data optimum:
    g_n = 2 r_n x_nᵀ, H = 2 XᵀX ⊗ I, so s_qn = 2 (r_q · r_n) x_qᵀ (XᵀX)⁻¹ x_n."""
    w = solve(x, y, np.arange(len(x)))
    r, rq = x @ w.T - y, xq @ w.T - yq
    return 2 * (rq @ r.T) * (xq @ np.linalg.solve(x.T @ x, x.T))


@pytest.mark.quality
def test_regression_lds_tables_from_hand_made_parts(tmp_path) -> None:
    """A regression's retraining parts hold each test sample's loss (test_losses); the tables pick
    the queries' columns (query_test_indices, not the first Q) and give the exact scores LDS near 1
    and their negation near −1, over parts split as the jobs split them."""
    x, y, xt, yt = least_squares(seed=SEED)
    n = len(x)
    queries = np.array([1, 4, 5, 8, 11])  # test samples, not the first ones
    masks = subset_masks(np.ones(n, bool), 40, 0.95, seed=SEED)
    test_losses = np.stack([((xt @ solve(x, y, np.flatnonzero(m)).T - yt) ** 2).sum(1) for m in masks])
    parts = []
    for part in range(2):
        ids = part_subsets(40, part, 2)
        path = tmp_path / f"retrain_{part}-of-2.npz"
        np.savez(path, subset_ids=ids, masks=masks[ids], test_losses=test_losses[ids])
        parts.append(str(path))
    scores = exact_scores(x, y, xt[queries], yt[queries])
    jobs, paths = [], []
    for method, pairwise in (("exact", scores), ("reversed", -scores)):
        path = tmp_path / f"{method}.npz"
        np.savez(
            path, pairwise_none=pairwise, query_test_indices=queries, query_labels=yt[queries],
            query_sign=np.float64(-1.0),
        )  # fmt: skip
        jobs.append({"index": 0, "epoch": 4, "method": method})
        paths.append(str(path))

    tables = lds_tables(jobs, paths, {(0, 4): parts[::-1]}, fraction=0.95, bootstrap=50)
    lds = tables["lds"].set_index("method")
    assert list(lds.index) == ["exact", "reversed", "random"]
    above("exact scores' LDS", lds.loc["exact", "lds"], 0.9)
    below("reversed scores' LDS", lds.loc["reversed", "lds"], -0.9)  # the first columns: -0.2
    below("|random scores' LDS|", abs(lds.loc["random", "lds"]), 0.5)
    assert (lds["n_queries"] == len(queries)).all() and (lds["n_subsets"] == 40).all()
    assert lds.loc["exact", "ci_low"] <= lds.loc["exact", "lds"] <= lds.loc["exact", "ci_high"]
    queries_table = tables["queries"]
    assert queries_table.query("method == 'exact'")["test_index"].tolist() == queries.tolist()

    read = read_parts(parts[::-1])  # in subset order whatever the order of the parts
    np.testing.assert_array_equal(read.masks, masks)
    np.testing.assert_array_equal(read.test_losses, test_losses)
    assert read.log_probs is None
    np.testing.assert_array_equal(read.query_losses(queries, yt[queries]), test_losses[:, queries])


def test_a_classifiers_parts_are_read_as_before_and_kinds_do_not_mix(tmp_path) -> None:
    masks = subset_masks(np.ones(6, bool), 3, 0.5, seed=0)
    log_probs = np.log(np.full((3, 4, 2), 0.5, np.float32))
    np.savez(tmp_path / "c.npz", subset_ids=np.arange(3), masks=masks, log_probs=log_probs,
             active_classes=np.array([1, 0]))  # fmt: skip
    read = read_parts([str(tmp_path / "c.npz")])
    assert isinstance(read, Retrainings) and read.test_losses is None
    np.testing.assert_array_equal(read.log_probs, log_probs)
    np.testing.assert_array_equal(read.active_classes, [1, 0])
    np.testing.assert_allclose(read.query_losses(np.array([2]), np.array([0])), np.log(2) * np.ones((3, 1)))
    np.savez(tmp_path / "r.npz", subset_ids=np.arange(3, 4), masks=masks[:1], test_losses=np.zeros((1, 4)))
    with pytest.raises(ValueError, match="holds test_losses, the other parts of its checkpoint log_probs"):
        read_parts([str(tmp_path / "c.npz"), str(tmp_path / "r.npz")])


# A user's training command, without torch: it "trains" on --subset by writing a checkpoint of its
# positions and seed; FAIL_FIRST makes its first attempt at a subset fail after saving its resume
# state, and it counts its runs in a file.
FAKE_TRAIN = textwrap.dedent(
    """
    import argparse, os, sys
    from pathlib import Path
    import numpy as np
    p = argparse.ArgumentParser()
    for name in ("--subset", "--data", "--out", "--resume", "--seed", "--runs"):
        p.add_argument(name, required=True)
    a = p.parse_args()
    with open(a.runs, "a") as f:
        f.write(a.subset + "\\n")
    positions = np.load(a.subset)
    assert positions.dtype == np.int64 and positions.ndim == 1
    resumed = (Path(a.resume) / "state").exists()
    if os.environ.get("FAIL_FIRST") and not resumed:
        (Path(a.resume) / "state").write_text("half-way")
        print("step 1: diverged"); sys.exit(3)
    print(f"training on {len(positions)} samples, seed {a.seed}, resumed {resumed}")
    np.save(Path(a.out) / "ckpt_3.npy", np.r_[positions, int(a.seed)])
    """
)


def fake_retraining(tmp_path: Path, command: str | None = None) -> CommandRetraining:
    (tmp_path / "train.py").write_text(FAKE_TRAIN)
    data = tmp_path / "data.npz"
    np.savez(data, x_train=np.zeros((10, 1), np.float32))
    command = command or (
        f"{sys.executable} {tmp_path / 'train.py'} --subset {{subset}} --data {{data}} --out {{output}} "
        f"--resume {{resume}} --seed {{seed}} --runs {tmp_path / 'runs.txt'}"
    )
    run = {"checkpoints": {"command": command, "path": "ckpt_{epoch}.npy"}}
    return CommandRetraining(
        spec=CommandSpec.from_config("own", run), index=1, epoch=3, seed=11, data_file=data,
        folder=lambda k: tmp_path / "lds" / ".retrain" / f"subset-{k}", key={"params": "p"},
    )  # fmt: skip


def measure_fake(checkpoint: Path) -> np.ndarray:
    """A 'test loss' per test sample (3 of them) from the fake checkpoint."""
    saved = np.load(checkpoint)
    return np.array([len(saved) - 1, saved[:-1].sum(), saved[-1]], np.float64)


def test_the_command_trains_each_subset_and_a_rerun_keeps_what_was_measured(tmp_path) -> None:
    retraining = fake_retraining(tmp_path)
    holdout = np.zeros(10, bool)
    holdout[[0, 9]] = True
    lds = {"subsets": 4, "fraction": 0.5, "seed": 2}
    masks = subset_masks(~holdout, 4, 0.5, 2)
    part = retrain_part_by_command(retraining, holdout, lds, 1, 2, measure_fake)
    assert part["subset_ids"].tolist() == [2, 3] and set(part) == {"subset_ids", "masks", "test_losses"}
    np.testing.assert_array_equal(part["masks"], masks[2:])
    for row, k in enumerate((2, 3)):  # trained on subset k's positions (never the holdout), seed 11
        positions = np.flatnonzero(masks[k])
        assert part["test_losses"][row].tolist() == [4, positions.sum(), 11]
        np.testing.assert_array_equal(np.load(retraining.folder(k) / "subset.npy"), positions)
        assert not (retraining.folder(k) / "output").exists()  # the retraining's checkpoints: not kept
    runs = (tmp_path / "runs.txt").read_text().splitlines()
    assert len(runs) == 2 and runs[0].endswith("subset-2/subset.npy")

    again = retrain_part_by_command(retraining, holdout, lds, 1, 2, measure_fake)  # e.g. a killed job
    np.testing.assert_array_equal(again["test_losses"], part["test_losses"])
    assert len((tmp_path / "runs.txt").read_text().splitlines()) == 2  # measured: not trained again
    retraining.key = {"params": "edited"}  # another command, files or data: trained again
    retrain_part_by_command(retraining, holdout, lds, 1, 2, measure_fake)
    assert len((tmp_path / "runs.txt").read_text().splitlines()) == 4

    remove_subset_folders(retraining, part["subset_ids"])
    assert not (tmp_path / "lds" / ".retrain").exists()


def test_a_failing_retraining_says_which_and_its_next_attempt_resumes(tmp_path, monkeypatch) -> None:
    retraining = fake_retraining(tmp_path)
    monkeypatch.setenv("FAIL_FIRST", "1")
    lds = {"subsets": 3, "fraction": 0.5, "seed": 0}
    with pytest.raises(CommandError) as failed:
        retrain_part_by_command(retraining, np.zeros(10, bool), lds, 0, 3, measure_fake)
    message = str(failed.value)
    assert "checkpoints.command (index 1, LDS retraining of subset 0) exited with status 3" in message
    assert "| step 1: diverged" in message and "subset-0/resume is kept" in message
    part = retrain_part_by_command(retraining, np.zeros(10, bool), lds, 0, 3, measure_fake)
    assert part["test_losses"].shape == (1, 3)


def test_a_retraining_without_the_analysed_checkpoint_is_an_error(tmp_path) -> None:
    retraining = fake_retraining(tmp_path, f"{sys.executable} -c pass {{subset}} {{output}}")
    lds = {"subsets": 3, "fraction": 0.5, "seed": 0}
    with pytest.raises(CommandError, match=r"\(index 1, LDS retraining of subset 0\) exited 0 but did not"):
        retrain_part_by_command(retraining, np.zeros(10, bool), lds, 0, 3, measure_fake)


def test_a_classifiers_retrainings_are_stored_as_the_pipelines(tmp_path, tiny_dataset) -> None:
    """A classifier's part: log_probs (m, N_test, A) and active_classes, the keys and dtypes of the
    pipeline's own retrainings; checkpoint_measure gives the model's test log-probabilities."""
    import torch

    from epochlens.models import build_model
    from epochlens.study.retrain import test_log_probs
    from epochlens.study.retrain_command import checkpoint_measure

    model = build_model("small_cnn", 3, 3, seed=0)
    torch.save({"model": model.state_dict()}, tmp_path / "ckpt.pt")
    active = np.array([2, 0, 1])
    measure = checkpoint_measure(tiny_dataset, {"name": "small_cnn", "key": "model"}, 3, "cpu", active)
    expected = test_log_probs(model, tiny_dataset, active, torch.device("cpu"))
    np.testing.assert_array_equal(measure(tmp_path / "ckpt.pt"), expected)

    retraining = fake_retraining(tmp_path)
    part = retrain_part_by_command(
        retraining, np.zeros(10, bool), {"subsets": 3, "fraction": 0.5, "seed": 0}, 0, 1,
        lambda _: expected, active,
    )  # fmt: skip
    assert set(part) == {"subset_ids", "masks", "log_probs", "active_classes"}
    assert part["log_probs"].shape == (3, 6, 3) and part["log_probs"].dtype == np.float32
    np.testing.assert_array_equal(part["active_classes"], active)
