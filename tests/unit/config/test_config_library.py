"""The configuration logic without Snakemake: schema defaults, cross-field checks, epochs, and
which settings change results (the rules' params)."""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from userproject.training_project import regression_run

from epochlens import config as run_config
from epochlens.ablation.settings import AblationSettings
from epochlens.curvature.settings import CurvatureSettings
from epochlens.errors import ConfigError
from epochlens.influence.settings import InfluenceSettings
from epochlens.probes.settings import ProbeSettings

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "config" / "schema.yaml"


def tiny_run(**sections) -> dict:
    """A digits run (4 classes, +3 every 2 epochs: checkpoints 0, 2, 4, 6) with ``sections``."""
    run = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "model": {"name": "small_cnn"},
        "schedule": {"initial_classes": 4, "increment": 3, "epochs_per_task": 2},
        "indices": [0],
    }
    run.update(copy.deepcopy(sections))
    return run


def validated(**sections) -> dict:
    return run_config.validate({"runs": {"tiny": tiny_run(**sections)}}, SCHEMA)["runs"]["tiny"]


def test_defaults_are_filled_as_snakemake_fills_them():
    from snakemake.utils import validate as snakemake_validate

    for path in (REPO / "config" / "config.yaml", REPO / "config" / "cifar100_lop.yaml"):
        ours = yaml.safe_load(path.read_text())
        theirs = copy.deepcopy(ours)
        run_config.fill_defaults(ours, SCHEMA)
        snakemake_validate(theirs, str(SCHEMA))
        assert ours == theirs, path.name
    cfg = run_config.fill_defaults({"runs": {"a": tiny_run(), "b": tiny_run()}}, SCHEMA)
    assert cfg["device"] == "auto" and cfg["runs"]["a"]["curvature"]["n_directions"] == 10
    cfg["runs"]["a"]["features"]["representations"].append("x")  # defaults are copies, not shared
    assert cfg["runs"]["b"]["features"]["representations"] == ["pooled", "stats", "spectral"]


def test_schema_errors_name_the_key_and_the_allowed_values():
    bad = {"runs": {"tiny": tiny_run(curvature={"norm": "l3", "h_step": 1})}}
    with pytest.raises(ConfigError) as err:
        run_config.validate(bad, SCHEMA)
    text = str(err.value)
    assert "runs.tiny.curvature.norm: 'l3' is not one of" in text and "allowed values: l2, l2_squared" in text
    assert "runs.tiny.curvature: Additional properties are not allowed ('h_step'" in text
    assert "allowed keys here:" in text and "2 problem(s)" in text


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"epochs": [3]}, "runs.tiny.epochs: [3] are not checkpoint epochs of this schedule"),
        ({"curvature": {"epochs": [3]}}, "runs.tiny.curvature.epochs: [3] are not analysed epochs"),
        ({"features": {"epochs": [3]}}, "runs.tiny.features.epochs: [3] are not analysed epochs"),
        ({"features": {"enabled": False}}, "runs.tiny.probes.enabled: probes need the features"),
        ({"features": {"layers": ["b9"]}}, "runs.tiny.features.layers: small_cnn has no module(s) ['b9']"),
        ({"ablation": {"blocks": ["fc.weight"]}}, "runs.tiny.ablation.blocks: small_cnn has no module(s)"),
        ({"ablation": {"channel_groups": 0, "whole_blocks": False}}, "leaves nothing to ablate"),
        ({"influence": {"enabled": True, "epochs": [3]}}, "runs.tiny.influence.epochs: [3] are not analysed"),
        (
            {"influence": {"enabled": True, "queries": {"trigger": True}}},
            "queries.trigger: true needs a trigger",
        ),
        (
            {"influence": {"enabled": True, "methods": ["tracin"], "tracin_epochs": [7]}},
            "runs.tiny.influence.tracin_epochs: [7] are not analysed",
        ),
        (
            {"influence": {"enabled": True, "methods": ["tracin"], "epochs": [2], "tracin_epochs": [4]}},
            "none is at or before influence epoch 2",
        ),
        (
            {"influence": {"enabled": True, "methods": ["tracin_rp"], "epochs": [2], "tracin_epochs": [4]}},
            "none is at or before influence epoch 2",
        ),
        (
            {"influence": {"enabled": True, "methods": ["trak"], "projection": {"precondition": "ekfac"}}},
            "runs.tiny.influence.projection.precondition: ekfac is logra's",
        ),
        (
            {"influence": {"enabled": True, "lds": {"enabled": True}, "transforms": ["hflip"]}},
            "runs.tiny.influence.lds: it correlates the untransformed queries' scores; add none",
        ),
        (
            {
                "checkpoints": {"source": "folder", "path": "ckpt/epoch_{epoch}.pt"},
                "influence": {"enabled": True, "lds": {"enabled": True}},
            },
            "runs.tiny.influence.lds: it retrains the run with the pipeline's recipe",
        ),
        (
            {"influence": {"enabled": True, "lds": {"enabled": True, "subsets": 4, "parts": 5}}},
            "parts (5) must not exceed subsets (4)",
        ),
    ],
)  # fmt: skip
def test_cross_field_errors_name_the_key(sections, message):
    with pytest.raises(ConfigError) as err:
        validated(**sections)
    assert message in str(err.value)


def test_trigger_target_outside_the_classes():
    data = {"source": "digits", "corruption": {"kind": "trigger", "target_class": 12}}
    with pytest.raises(ConfigError, match=r"corruption.target_class: 12 is not a class .*\(0..9\)"):
        validated(data=data)


def test_unknown_layers_error_lists_the_default_blocks():
    with pytest.raises(ConfigError, match=r"Default \(block outputs.*\['block1', 'block2', 'block3'\]"):
        validated(features={"layers": ["block1", "nope"]})
    validated(features={"layers": ["block1", "block2.0"]}, ablation={"blocks": ["block3"]})  # fine


def test_epochs_of_each_section():
    run = validated(
        checkpoints={"source": "train", "save_every": 1},
        features={"epochs": [2, 6]},
        ablation={"enabled": False},
        influence={"enabled": True},
    )
    assert run_config.checkpoint_epochs(run) == [0, 1, 2, 3, 4, 5, 6]
    assert run_config.analysis_epochs("tiny", run) == [0, 1, 2, 3, 4, 5, 6]
    assert run_config.curvature_epochs("tiny", run) == [0, 1, 2, 3, 4, 5, 6]
    assert run_config.section_epochs("tiny", run, "features") == [2, 6]
    assert run_config.probe_epochs("tiny", run) == [2, 6]
    assert run_config.section_epochs("tiny", run, "ablation") == []
    # influence: the section's epochs default to the last analysed one, not to all of them
    assert run_config.influence_epochs("tiny", run) == [6]
    run["epochs"] = [2, 4]
    assert run_config.influence_epochs("tiny", run) == [4]
    assert run_config.tracin_epochs("tiny", run, 4) == [4]  # analysed epochs after the first
    run["epochs"] = None
    assert run_config.tracin_epochs("tiny", run, 4) == [1, 2, 3, 4]
    assert run_config.influence_epochs("tiny", validated()) == []  # disabled by default


def _result_fields(settings_class) -> set[str]:
    return {f.name for f in fields(settings_class) if not f.metadata.get("execution")}


@pytest.mark.parametrize(
    ("section", "settings_class", "expected"),
    [
        (
            "curvature",
            CurvatureSettings,
            ["h", "n_directions", "temperature", "norm", "mode", "seed", "tolerance"],
        ),
        (
            "probes",
            ProbeSettings,
            ["seeds", "stop_fraction", "max_epochs", "patience", "lr", "weight_decay", "batch_size"],
        ),
        ("ablation", AblationSettings, ["blocks", "channel_groups", "whole_blocks", "modes"]),
    ],
)
def test_result_settings_are_the_dataclass_fields_that_are_not_execution(section, settings_class, expected):
    run = validated()
    got = run_config.result_settings(run[section], settings_class)
    assert list(got) == expected
    assert set(got) == _result_fields(settings_class) & set(run[section])
    assert "batch_size" not in got or section == "probes"  # part of the probes' method


def test_a_classifiers_curvature_params_have_no_regression_fields():
    """Existing runs keep their params (no rerun of their curvature): tolerance and reduction are
    a regression's only, the reduction taken from its task."""
    settings = run_config.curvature_params(validated())["settings"]
    assert list(settings) == ["h", "n_directions", "temperature", "norm", "mode", "seed"]


def test_a_regressions_curvature_params_take_the_reduction_from_the_task(tmp_path):
    run = regression_run(tmp_path, task={"name": "regression", "kwargs": {"reduction": "sum"}})
    regression = run_config.validate({"runs": {"r": run}}, SCHEMA)["runs"]["r"]
    settings = run_config.curvature_params(regression)["settings"]
    assert settings["tolerance"] == 0.1 and settings["reduction"] == "sum"
    assert run_config.curvature_params(regression)["schedule"] is None  # no classes


def test_lds_params_leave_out_the_split_into_jobs_and_the_bootstrap():
    run = validated(influence={"enabled": True, "lds": {"enabled": True, "parts": 4, "bootstrap": 50}})
    params = run_config.lds_retrain_params(run)
    assert params["lds"] == {"enabled": True, "subsets": 16, "fraction": 0.5, "seed": 0}
    assert params["run"] == run_config.run_params(run)  # the training job's: a recipe change reruns
    assert run_config.lds_table_params(run)["bootstrap"] == 50


def test_execution_settings_and_device_change_no_params():
    base = validated(influence={"enabled": True, "methods": ["ekfac", "identity"]})
    changed = copy.deepcopy(base)
    changed["curvature"].update(batch_size=7, processes=3, shards=4)
    changed["features"]["batch_size"] = 9
    changed["ablation"]["batch_size"] = 5
    changed["influence"].update(factor_batch_size=3, train_batch_size=3, query_batch_size=3)
    changed["influence"]["queries"]["reduce"] = "mean"  # tables only
    changed["evaluation"]["batch_size"] = 3
    for params in (
        run_config.curvature_params,
        run_config.feature_params,
        run_config.probe_params,
        run_config.ablation_params,
    ):
        assert params(base) == params(changed)
    for method in ("ekfac", "identity"):
        assert run_config.influence_factor_params(base, method) == run_config.influence_factor_params(
            changed, method
        )
        assert run_config.influence_score_params("tiny", base, method, 6) == (
            run_config.influence_score_params("tiny", changed, method, 6)
        )
    assert run_config.poison_detection_params(changed)["reduce"] == "mean"


def test_params_change_with_the_settings_that_change_results():
    run = validated(influence={"enabled": True})
    curv = run_config.curvature_params(run)
    assert curv == {"settings": curv["settings"], "model": "small_cnn", "schedule": run["schedule"]}
    run["curvature"]["h"] = 0.01
    assert run_config.curvature_params(run)["settings"]["h"] == 0.01

    features = run_config.feature_params(run)
    assert features == {
        "layers": None,
        "representations": {
            "names": ["pooled", "stats", "spectral"],
            "spectral_k": 8,
            "spectral_method": "auto",
        },
        "dtype": "float32",
    }
    run["features"]["representations"] = ["pooled"]  # spectral settings only with spectral
    assert run_config.feature_params(run)["representations"] == {"names": ["pooled"]}
    run["features"]["precision"] = "bfloat16"  # a 16-bit forward only: float32 runs keep their params
    assert run_config.feature_params(run)["precision"] == "bfloat16"

    ekfac = run_config.influence_score_params("tiny", run, "ekfac", 6)["settings"]
    assert {"method", "fisher", "layers", "exclude_layers", "seed", "damping", "damping_mode"} <= set(ekfac)
    assert ekfac["queries"] == {k: v for k, v in run["influence"]["queries"].items() if k != "reduce"}
    assert {"transforms", "noise_std", "crop_pad", "transform_seed"} <= set(ekfac) and "top_k" not in ekfac
    # identity inverts no curvature: damping does not change its scores; it fits no factors
    identity = run_config.influence_score_params("tiny", run, "identity", 6)["settings"]
    assert not {k for k in identity if k.startswith("damping")} and "fisher" not in identity
    factor = run_config.influence_factor_params(run, "kfac")["settings"]
    assert set(factor) == {"method", *(set(InfluenceSettings().factor_key()) - {"scheme", "compute_dtype"})}
    assert "tracin_epochs" in run_config.influence_score_params("tiny", run, "tracin", 6)
    assert run_config.influence_score_params("tiny", run, "tracin", 6)["tracin_epochs"] == [2, 4, 6]


def test_training_sees_no_analysis_section():
    run = validated()
    params = run_config.run_params(run)
    assert not set(run_config.ANALYSIS_SECTIONS) & set(params)
    # every section that only says what to analyse, the sample dossier's too (a new one must not
    # rerun every evaluation of a finished run)
    assert {"curvature", "features", "probes", "ablation", "influence", "samples"} <= set(run) - set(params)
    assert params["train"] == run["train"] and params["schedule"] == run["schedule"]


def test_config_logic_imports_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, epochlens.config, epochlens.models, epochlens.curvature, epochlens.features, "
        "epochlens.probes, epochlens.ablation, epochlens.influence, epochlens.study, epochlens.data, "
        "epochlens.layout; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


TEXT_MODEL = {"hf": {"config": {"model_type": "bert", "hidden_size": 16}}}
IMAGE_STAGES_OFF = {s: {"enabled": False} for s in ("features", "probes", "ablation")}


def text_run(**sections) -> dict:
    run = {
        "data": {"source": "polarity", "text": {"max_length": 16}},
        "model": copy.deepcopy(TEXT_MODEL),
        "schedule": {"initial_classes": 2, "increment": 0, "epochs_per_task": 4},
        **copy.deepcopy(IMAGE_STAGES_OFF),
    }
    run.update(copy.deepcopy(sections))
    return run


def test_a_text_run_validates_and_plans_its_checkpoints():
    cfg = run_config.validate({"runs": {"pol": text_run()}}, SCHEMA)
    run = cfg["runs"]["pol"]
    assert (
        run["model"]["hf"]["task"] == "sequence_classification" and run["model"]["hf"]["attention"] == "eager"
    )
    assert run_config.checkpoint_epochs(run) == [0, 4]
    assert run_config.model_param(run) == run["model"]  # the jobs build the transformer from it
    # An image run's params are unchanged by the text keys (no defaults added to data or train).
    image = validated()
    assert (
        "text" not in image["data"] and "polarity" not in image["data"] and "optimizer" not in image["train"]
    )


@pytest.mark.parametrize(
    ("run", "match"),
    [
        (text_run(model={"name": "small_cnn"}), "model.hf .a transformer. goes with text data"),
        (tiny_run(model=TEXT_MODEL), "this run has model.hf without text data"),
        (text_run(model={"hf": {}}), r"model.hf.config: the model's config.json as a mapping"),
        (
            text_run(influence={"enabled": True, "transforms": ["none", "hflip"]}),
            r"influence.transforms without \['hflip'\] \(image transforms; a text run's are \['none', "
            r"'token_dropout', 'truncate'\]\)",
        ),
        (
            tiny_run(influence={"enabled": True, "transforms": ["none", "truncate"]}),
            r"influence.transforms: \['truncate'\] transform texts; an image run's are",
        ),
    ],
)
def test_text_run_errors_name_the_keys_to_fix(run, match):
    with pytest.raises(ConfigError, match=match):
        run_config.validate({"runs": {"pol": run}}, SCHEMA)


def test_features_and_probes_of_sequence_classifiers_and_causal_lms(monkeypatch, tmp_path):
    on = {"features": {"enabled": True}, "probes": {"enabled": True}}
    run = run_config.validate({"runs": {"pol": text_run(**on)}}, SCHEMA)["runs"]["pol"]
    assert run["features"]["enabled"] and run["probes"]["enabled"]
    assert run_config.probe_params(run)["targets"] == ["class", "cohort", "curvature"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "checkpoint-10").mkdir(parents=True)
    lm = run_config.validate({"runs": {"lm": lm_run(**on)}}, SCHEMA)["runs"]["lm"]
    # a causal LM's probes: its prompt groups and curvature (it has no classes)
    assert run_config.probe_params(lm)["targets"] == ["group", "curvature"]
    bad = lm_run(features={"enabled": True}, probes={"enabled": True, "targets": ["class", "group"]})
    with pytest.raises(ConfigError, match=r"probes.targets: the run is a language model; \['class'\] are"):
        run_config.validate({"runs": {"lm": bad}}, SCHEMA)


def test_lds_of_a_text_classifier_trained_by_the_pipeline():
    """The pipeline retrains a text classifier from its model.hf.config as it trains an image
    network; a run read from the user's folder cannot be retrained."""
    lds = {"enabled": True, "transforms": ["none", "token_dropout"], "lds": {"enabled": True, "subsets": 4}}
    run = run_config.validate({"runs": {"pol": text_run(influence=lds)}}, SCHEMA)["runs"]["pol"]
    assert run_config.lds_retrain_params(run)["run"]["model"]["hf"]["config"]["model_type"] == "bert"
    folder = text_run(influence=lds, checkpoints={"source": "folder", "path": "runs/checkpoint-{epoch}"})
    with pytest.raises(ConfigError, match="influence.lds: it retrains the run with the pipeline's recipe"):
        run_config.validate({"runs": {"pol": folder}}, SCHEMA)


@pytest.mark.parametrize(
    ("task", "source", "match"),
    [
        ("text_to_text", "train", None),
        ("text_to_text", "folder", "it retrains the run with the pipeline's recipe"),
        ("text_to_text", "command", "a text-to-text run's LDS retrains with the pipeline's recipe, not a"),
        (
            "language_model",
            "train",
            "it measures classification, regression or text-to-text losses; task language_model is not",
        ),
    ],
)
def test_lds_of_a_text_to_text_run_trained_by_the_pipeline(task, source, match):
    """A text-to-text run's LDS: retrained by the pipeline's recipe (checkpoints.source: train), its
    queries' target-token losses measured; a run read from a folder, or a causal LM, is refused."""
    from epochlens.config.influence_checks import check_lds_config

    lds = {"enabled": True, "subsets": 4, "fraction": 0.5, "parts": 1, "start": "scratch"}
    influence = {"enabled": True, "lds": lds, "transforms": ["none"], "queries": {"trigger": None}}
    checkpoints = {
        "source": source,
        "command": "python train.py {subset} {data} {output}",
        "path": "{output}",
    }
    run = {"influence": influence, "checkpoints": checkpoints, "model": {"hf": {"task": "text_to_text"}}}
    if match is None:
        check_lds_config("t5", run, task, {"kind": "none"})
        return
    with pytest.raises(ConfigError, match=f"runs.t5.influence.lds: {match}"):
        check_lds_config("t5", run, task, {"kind": "none"})


def test_a_user_text_file_needs_its_text_section_and_path():
    run = text_run(data={"source": "jsonl", "path": "texts.jsonl"})
    with pytest.raises(ConfigError, match="text"):
        run_config.validate({"runs": {"pol": run}}, SCHEMA)


def lm_run(**sections) -> dict:
    run = text_run(
        data={
            "source": "jsonl",
            "path": "prompts",
            "text": {"tokenizer": "tok", "prompt_column": "prompt", "target_column": "target"},
        },
        model={"hf": {"task": "causal_lm"}},
        schedule="none",
        checkpoints={"source": "folder", "path": "runs/checkpoint-{epoch}"},
        curvature={"enabled": False},
        influence={"enabled": False},
    )
    run.update(copy.deepcopy(sections))
    return run


def test_a_causal_lm_run_has_no_class_schedule(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for step in (10, 20):
        (tmp_path / "runs" / f"checkpoint-{step}").mkdir(parents=True)
    lm = lm_run(ablation={"enabled": True}, curvature={"enabled": True})  # curvature is available
    cfg = run_config.validate({"runs": {"lm": lm}}, SCHEMA)
    run = cfg["runs"]["lm"]
    assert run_config.is_causal_lm_run(run) and run_config.checkpoint_epochs(run) == [10, 20]
    # its jobs read no class schedule (a causal LM's samples have no classes) ...
    assert run_config.class_schedule(run) is None and run_config.run_params(run)["schedule"] is None
    assert run_config.curvature_params(run)["schedule"] is None
    # ... while a classifier's jobs read the schedule as before
    pol = run_config.validate({"runs": {"pol": text_run()}}, SCHEMA)["runs"]["pol"]
    assert run_config.class_schedule(pol) == pol["schedule"] == run_config.run_params(pol)["schedule"]
    assert run_config.curvature_params(pol)["schedule"] == pol["schedule"]


@pytest.mark.parametrize(
    ("run", "match"),
    [
        (lm_run(model={"hf": {"task": "sequence_classification", "config": {}}}), "model.hf.task: causal_lm"),
        (text_run(model={"hf": {"task": "causal_lm", "config": {}}}), "prompt_column and target_column"),
        (lm_run(influence={"enabled": True, "queries": {"select": "all"}}), r"set task: language_model \("),
        (
            lm_run(
                task="language_model",
                influence={"enabled": True, "queries": {"select": "all"}, "transforms": ["none", "truncate"]},
            ),
            r"influence.transforms: \[none\] \(a query is a test prompt",
        ),
        (lm_run(checkpoints={"source": "train"}), r"checkpoints: \{source: folder"),
        (lm_run(schedule={"initial_classes": 1, "increment": 0, "epochs_per_task": 4}), "schedule: none"),
    ],
)
def test_causal_lm_run_errors_name_the_keys_to_fix(run, match):
    with pytest.raises(ConfigError, match=match):
        run_config.validate({"runs": {"lm": run}}, SCHEMA)


def test_warm_started_lds_needs_a_checkpoint_before_each_influence_epoch():
    def run(epochs):
        lds = {"enabled": True, "start": "previous"}
        return tiny_run(
            checkpoints={"source": "train"}, influence={"enabled": True, "epochs": epochs, "lds": lds}
        )

    cfg = run_config.validate({"runs": {"tiny": run([2, 4])}}, SCHEMA)["runs"]["tiny"]
    assert [run_config.lds_start_epoch(cfg, e) for e in (2, 4)] == [0, 2]
    scratch = run_config.validate({"runs": {"tiny": tiny_run(checkpoints={"source": "train"})}}, SCHEMA)
    assert run_config.lds_start_epoch(scratch["runs"]["tiny"], 4) is None
    with pytest.raises(
        ConfigError, match=r"start: previous needs a checkpoint before each influence epoch; epoch\(s\) \[0\]"
    ):
        run_config.validate({"runs": {"tiny": run([0, 4])}}, SCHEMA)


def _validate(run: dict) -> dict:
    return run_config.validate({"runs": {"r": copy.deepcopy(run)}}, SCHEMA)["runs"]["r"]


def test_the_data_kind_is_checked_against_the_task_before_any_job(tmp_path):
    """Integer labels with task regression, float targets with a classifier: the dry run says so,
    naming the file and the fix (an .npz's labels are read, not its inputs)."""
    import numpy as np

    run = regression_run(tmp_path)
    x = np.zeros((4, 9), np.float32)
    np.savez(tmp_path / "matrices.npz", x_train=x, y_train=np.arange(4), x_test=x, y_test=np.arange(4))
    with pytest.raises(ConfigError, match=r"task regression, but .*npz holds integer labels.*floats"):
        _validate(run)
    np.savez(tmp_path / "matrices.npz", x_train=x, y_train=x, x_test=x, y_test=x)
    assert _validate(run)["task"] == "regression"
    classifier = {**run, "task": "classification", "schedule": "none"}
    with pytest.raises(ConfigError, match=r"holds float targets .*task is classification: set runs.r.task"):
        _validate(classifier)


def test_what_a_regression_run_must_change_is_named_at_once(tmp_path):
    run = regression_run(tmp_path, model={"name": "small_cnn"}, data={"source": "digits"})
    run["schedule"] = {"initial_classes": 2, "increment": 2, "epochs_per_task": 5}
    run["checkpoints"] = {"source": "train"}
    with pytest.raises(ConfigError) as err:
        _validate(run)
    for fix in ("data.source: one of", "model.factory", "schedule: none"):
        assert fix in str(err.value)
    noisy = tiny_run(data={"source": "digits", "corruption": {"kind": "target_noise"}})
    with pytest.raises(ConfigError, match="target_noise adds noise to regression targets"):
        _validate(noisy)


def test_a_regressions_influence_queries_and_transforms(tmp_path):
    run = regression_run(tmp_path, influence={"enabled": True, "methods": ["identity"]})
    assert _validate(copy.deepcopy(run))["influence"]["queries"]["select"] == "all"  # its default
    run["influence"]["queries"] = {"select": "misclassified"}  # no meaning for a regression
    with pytest.raises(ConfigError, match="select: all or highest_loss and queries.labels: correct"):
        _validate(copy.deepcopy(run))
    run["influence"]["queries"] = {"select": "highest_loss"}
    assert _validate(run)["influence"]["queries"]["select"] == "highest_loss"
    run["influence"]["transforms"] = ["none", "hflip"]
    with pytest.raises(ConfigError, match=r"\['hflip'\] transform images or texts"):
        _validate(run)
    classifier = tiny_run(influence={"enabled": True, "queries": {"select": "highest_loss"}})
    with pytest.raises(ConfigError, match="highest_loss is a regression's"):
        _validate(classifier)


def test_each_stored_representation_has_its_own_params_and_code(tmp_path):
    """A run of stored activations: a job per representation, whose params and code inputs change
    only with what changes that representation (its function's files, spectral's settings)."""
    (tmp_path / "code" / "myreps").mkdir(parents=True)
    (tmp_path / "code" / "myreps" / "__init__.py").write_text("")
    source = tmp_path / "code" / "myreps" / "pool.py"
    source.write_text("def top(act):\n    return act.flatten(1)\n")
    (tmp_path / "acts" / "step_1").mkdir(parents=True)
    stored = {
        "data": {"source": "digits", "holdout_per_class": 5},
        "schedule": "none",
        "checkpoints": {"source": "activations", "path": str(tmp_path / "acts" / "step_{epoch}")},
        "features": {
            "representations": ["mean", "spectral", "myreps.pool:top"],
            "project_path": str(tmp_path / "code"),
        },
        "curvature": {"enabled": False},
        "ablation": {"enabled": False},
        "influence": {"enabled": False},
    }
    run = run_config.validate({"runs": {"acts": stored}}, SCHEMA)["runs"]["acts"]
    reps = run_config.stored_representations(run)
    assert reps == ["mean", "spectral", "myreps.pool:top"]

    def params(r):
        return {rep: run_config.stored_feature_params(r, rep) for rep in reps}

    before = params(run)
    assert all(p["representations"] == [rep] for rep, p in before.items())
    assert "user_code" not in before["mean"] and "spectral_k" not in before["mean"]
    assert run_config.stored_code(run, "mean") == [] and run_config.stored_code(run, "spectral") == []
    assert str(source) in run_config.stored_code(run, "myreps.pool:top")
    source.write_text("def top(act):\n    return act.flatten(1)[:, :2]\n")
    edited = params(run)
    assert [rep for rep in reps if edited[rep] != before[rep]] == ["myreps.pool:top"]
    run["features"]["spectral_k"] = 3
    assert [rep for rep in reps if params(run)[rep] != edited[rep]] == ["spectral"]
    with pytest.raises(ConfigError, match="representation 'max' is not in features.representations"):
        run_config.stored_feature_params(run, "max")
