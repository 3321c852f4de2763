"""Where a run's checkpoints are and which are missing: every one listed at once, with the fix."""

from __future__ import annotations

import copy
from pathlib import Path

from epochlens import config as run_config
from epochlens.layout import Layout

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "config" / "schema.yaml"


def folder_run(template: str, **sections) -> dict:
    """A digits run reading its checkpoints from ``template`` (4 classes, +3 every 2 epochs:
    checkpoints at 0, 2, 4, 6), indices 0 and 1."""
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0, 1],
        "checkpoints": {"source": "folder", "path": template},
    }
    run.update(copy.deepcopy(sections))
    return run


def write_checkpoints(folder: Path, indices=(0, 1), epochs=(0, 2, 4, 6)) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for index in indices:
        for epoch in epochs:
            (folder / f"index-{index}_epoch-{epoch}.pt").write_bytes(b"")
    return str(folder / "index-{index}_epoch-{epoch}.pt")


def test_checkpoint_path_of_a_folder_run_and_of_a_trained_run(tmp_path):
    cfg = run_config.validate({"runs": {"lop": folder_run("/ckpts/i{index}/e{epoch}.pt")}}, SCHEMA)
    run = cfg["runs"]["lop"]
    # Snakemake's wildcards are digits: "0400" is epoch 400.
    assert run_config.checkpoint_path("lop", run, "1", "0400") == "/ckpts/i1/e400.pt"
    assert run_config.needs_file(run)
    run["checkpoints"] = {"source": "train"}
    layout = Layout(tmp_path / "results")
    assert run_config.checkpoint_path("lop", run, 1, 400, layout) == layout.checkpoint("lop", 1, 400)
    assert not run_config.needs_file(run)


def test_every_missing_checkpoint_of_every_run_is_found(tmp_path):
    template = write_checkpoints(tmp_path / "a")
    Path(template.format(index=0, epoch=2)).unlink()
    Path(template.format(index=1, epoch=6)).unlink()
    other = write_checkpoints(tmp_path / "b", indices=(0,), epochs=(0, 2))  # 4 and 6 missing
    cfg = run_config.validate(
        {
            "runs": {
                "a": folder_run(template),
                "b": folder_run(other, indices=[0]),
                "trained": folder_run("x", checkpoints={"source": "train"}),  # made by the pipeline
            }
        },
        SCHEMA,
    )
    missing = run_config.missing_checkpoints(cfg)
    assert [(m.run, m.index, m.epoch) for m in missing] == [
        ("a", 0, 2),
        ("a", 1, 6),
        ("b", 0, 4),
        ("b", 0, 6),
    ]
    assert missing[0].path == template.format(index=0, epoch=2)


def test_only_the_analysed_epochs_are_needed(tmp_path):
    template = write_checkpoints(tmp_path, epochs=(0, 6))
    cfg = run_config.validate({"runs": {"a": folder_run(template, epochs=[0, 6])}}, SCHEMA)
    assert run_config.missing_checkpoints(cfg) == []
    cfg["runs"]["a"]["epochs"] = [0, 2, 6]
    assert [(m.index, m.epoch) for m in run_config.missing_checkpoints(cfg)] == [(0, 2), (1, 2)]


def test_one_message_lists_every_missing_file_and_the_fix(tmp_path):
    template = write_checkpoints(tmp_path)
    for index, epoch in ((0, 2), (1, 4), (1, 6)):
        Path(template.format(index=index, epoch=epoch)).unlink()
    cfg = run_config.validate({"runs": {"a": folder_run(template)}}, SCHEMA)
    missing = run_config.missing_checkpoints(cfg)
    text = run_config.missing_checkpoints_message(missing, cfg, keep_going=False)
    assert text.startswith("3 checkpoint(s) that the config needs are missing (run a: 3 of 8)")
    for m in missing:
        assert f"{m.path}  (run a, index {m.index}, epoch {m.epoch})" in text
    assert "correct checkpoints.path of runs.a" in text and "epochs: [...]" in text
    assert "Nothing was run" in text and "--keep-going" in text
    kept = run_config.missing_checkpoints_message(missing, cfg, keep_going=True)
    assert "Nothing was run" not in kept and "epochs whose checkpoints exist run" in kept
    assert f"job ({run_config.MISSING_RULE}) fails" in kept
    # The job standing for one of them names its file, the run's template and the fix.
    error = run_config.missing_checkpoint_error(missing[0], cfg)
    assert error.startswith(f"{missing[0].path}: checkpoint not found (run a, index 0, epoch 2)")
    assert template in error and "runs.a.epochs" in error


def test_a_wrong_template_says_that_nothing_was_found(tmp_path):
    template = str(tmp_path / "no-such-folder" / "index-{index}_epoch-{epoch}.pt")
    cfg = run_config.validate({"runs": {"a": folder_run(template)}}, SCHEMA)
    missing = run_config.missing_checkpoints(cfg)
    assert len(missing) == 8
    text = run_config.missing_checkpoints_message(missing, cfg, keep_going=True)
    assert "(run a: 8 of 8 (none found))" in text
    assert f"the folder {tmp_path / 'no-such-folder'} does not exist" in text


def test_long_lists_are_cut(tmp_path):
    template = str(tmp_path / "index-{index}_epoch-{epoch}.pt")
    run = folder_run(template, indices=list(range(10)))
    cfg = run_config.validate({"runs": {"a": run}}, SCHEMA)
    missing = run_config.missing_checkpoints(cfg)
    assert len(missing) == 40
    text = run_config.missing_checkpoints_message(missing, cfg, keep_going=True)
    assert text.count("  (run a, index") == run_config.inputs.MAX_LISTED
    assert f"... and {40 - run_config.inputs.MAX_LISTED} more" in text
