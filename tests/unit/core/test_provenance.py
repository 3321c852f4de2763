"""Which library files a script depends on, and provenance records."""

from __future__ import annotations

import hashlib
from pathlib import Path

from epochlens.provenance import PACKAGE_DIR, file_digests, module_sources, table_provenance


def _found(tmp_path, source: str) -> set[str]:
    script = tmp_path / "s.py"
    script.write_text(source)
    return {p.relative_to(PACKAGE_DIR).as_posix() for p in module_sources(script)}


def test_module_sources_are_transitive(tmp_path):
    found = _found(tmp_path, "from epochlens.curvature.io import merge_shards\n")
    # curvature/io.py imports atomic, errors and provenance
    assert {"curvature/io.py", "atomic.py", "errors.py", "provenance.py"} <= found
    assert "curvature/estimator.py" not in found and "__init__.py" not in found


def test_module_sources_follow_imports_through_a_subpackage(tmp_path):
    # A lazily exported name counts as the module that defines it (and the package's __init__).
    found = _found(tmp_path, "from epochlens.influence import InfluenceSettings\n")
    assert {"influence/__init__.py", "influence/settings.py", "_lazy.py", "errors.py"} <= found
    assert "influence/scores.py" not in found
    found = _found(tmp_path, "from epochlens.influence import self_influence\n")
    assert {"influence/scores.py", "influence/precondition.py", "models/layers.py"} <= found
    # A submodule import counts its parent packages' __init__.py (Python runs them).
    found = _found(tmp_path, "from epochlens.curvature.estimator import per_sample_curvature\n")
    assert {"curvature/__init__.py", "curvature/estimator.py", "curvature/settings.py"} <= found
    assert not {p for p in found if p.startswith(("features/", "influence/", "probes/", "ablation/"))}


def test_unknown_names_and_bare_package_imports_count_the_whole_package(tmp_path):
    everything = {p.relative_to(PACKAGE_DIR).as_posix() for p in (PACKAGE_DIR / "curvature").glob("*.py")}
    assert _found(tmp_path, "import epochlens.curvature\n") >= everything
    assert _found(tmp_path, "from epochlens.curvature import not_exported\n") >= everything
    assert _found(tmp_path, "from epochlens.curvature import *\n") >= everything
    # an eager package (data) counts its __init__ and what that imports
    assert {"data/__init__.py", "data/dataset.py", "data/sources.py"} <= _found(
        tmp_path, "from epochlens.data import read_dataset\n"
    )


def test_module_sources_count_a_scripts_helper_module(tmp_path):
    (tmp_path / "_helpers.py").write_text("from epochlens.layout import RESULTS\n")
    script = tmp_path / "s.py"
    script.write_text("import json\nfrom _helpers import RESULTS\n")
    found = module_sources(script)
    assert (tmp_path / "_helpers.py").resolve() in found
    assert PACKAGE_DIR / "layout.py" in found


def test_lazy_exports_name_the_module_that_defines_them():
    import importlib

    from epochlens._lazy import module_of
    from epochlens.provenance import _lazy_exports

    packages = [init for init in PACKAGE_DIR.glob("*/__init__.py") if _lazy_exports(init) is not None]
    assert {p.parent.name for p in packages} >= {"curvature", "features", "probes", "ablation", "influence"}
    for init in packages:
        package = f"epochlens.{init.parent.name}"
        for name, target in _lazy_exports(init).items():
            defining = importlib.import_module(module_of(package, target))
            assert getattr(importlib.import_module(package), name) is getattr(defining, name)
            source = Path(defining.__file__).read_text()
            assert (
                f"def {name}(" in source
                or f"class {name}" in source
                or f"\n{name} =" in source
                or f"\n{name}: " in source
            ), f"{package}.{name} is not defined in {defining.__name__}"


def test_table_provenance_hashes_inputs(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("x\n1\n")
    record = table_provenance({"k": 1}, [a], ["t.csv"])
    assert record["tables"] == ["t.csv"]
    assert record["inputs"] == file_digests([a])
    assert record["inputs"][str(a)] == "sha256:" + hashlib.sha256(b"x\n1\n").hexdigest()
    assert set(record) >= {"code", "config_hash", "packages"}


# Stage packages: a script of one stage never depends on another stage's modules (features and
# probes are one stage for this purpose), so that editing one stage reruns only its jobs.
STAGES = {"curvature", "features", "probes", "ablation", "influence", "samples", "explorer"}
OWN = {
    "curvature_shard": {"curvature"},
    "curvature_epoch": {"curvature"},
    "curvature_tables": {"curvature"},
    "features_epoch": {"features"},
    "features_stored": {"features"},  # the user's stored activations: no model
    "activations_decoded": {"features"},  # their parquet snapshot decoded once
    "probes_epoch": {"features", "probes"},
    "probe_tables": {"probes"},
    "ablation_epoch": {"ablation"},
    "ablation_tables": {"ablation"},
    "influence_factors": {"influence"},
    "influence_scores": {"influence"},
    "influence_factor_shard": {"influence"},
    "influence_score_shard": {"influence"},
    "influence_store_shard": {"influence"},
    "influence_store_scores": {"influence"},
    "influence_store_eigen": {"influence"},
    "poison_detection": {"influence"},
    "lds_retrain": set(),  # retrains with the run's recipe or its command; no influence code
    "lds_tables": set(),  # reads the scores' files, not the influence package
    "evaluate_checkpoint": set(),
    "sample_outputs_shard": {"samples"},  # the one model pass of the dossier's stage
    "sample_outputs": {"samples"},  # its merge, torch-free
    "sample_thumbnails": {"samples"},
    # the dossier reads every stage's cached results: CSL and learning time as the curvature stage
    # defines them (curvature.dynamics), query influence as the detection table reduces it
    "sample_dossier": {"samples", "curvature", "influence"},
    "sample_explorer": {"explorer"},  # reads the dossier's file, not the samples package
    "accuracy_tables": set(),
    "regression_tables": set(),
    "train": set(),
    "train_command": set(),
    "training_data": set(),
    "comparison_tables": set(),  # reads the runs' tables
    "prepare_data": set(),
    "class_order": set(),
    "missing_checkpoint": set(),
}


#: What every figure shares (plotting/common.py imports ticks.py).
SHARED_PLOTTING = ("plotting/__init__.py", "plotting/common.py", "plotting/ticks.py")


def test_real_scripts_depend_on_their_own_stage_only():
    scripts = PACKAGE_DIR.parents[1] / "scripts"
    assert {p.stem for p in scripts.glob("[!_]*.py") if not p.stem.startswith("plot_")} == set(OWN)
    for name, own in OWN.items():
        found = {
            p.relative_to(PACKAGE_DIR).parts[0]
            for p in module_sources(scripts / f"{name}.py")
            if p.is_relative_to(PACKAGE_DIR)
        }
        assert not (found & STAGES) - own, f"{name} depends on {sorted((found & STAGES) - own)}"
        assert own <= found, name
    for plot in scripts.glob("plot_*.py"):
        found = {
            str(p.relative_to(PACKAGE_DIR)) for p in module_sources(plot) if p.is_relative_to(PACKAGE_DIR)
        }
        other_figures = {f for f in found if f.startswith("plotting/") and f not in SHARED_PLOTTING}
        assert len(other_figures) == 1, (plot.name, other_figures)  # its own stage's figures only
        assert not {f.split("/")[0] for f in found} & STAGES, plot.name
    # fitting factors does not depend on how scores are computed (a score edit refits nothing)
    factors = {
        str(p.relative_to(PACKAGE_DIR))
        for p in module_sources(scripts / "influence_factors.py")
        if p.is_relative_to(PACKAGE_DIR)
    }
    assert "influence/scores.py" not in factors and "influence/study_factors.py" in factors
    # every script counts the helper module next to it
    assert scripts / "_helpers.py" in module_sources(scripts / "train.py")


def test_module_sources_are_cached_until_a_module_changes(tmp_path):
    """The dry run reads the import graph from <package>/__pycache__/module_sources.json; an edit,
    a new or a removed module is seen at once, in this process and the next."""
    import subprocess
    import sys

    package = tmp_path / "epochlens"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from epochlens.b import x\n")
    (package / "b.py").write_text("x = 1\n")
    (package / "c.py").write_text("y = 2\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "s.py").write_text("from epochlens.a import x\n")

    def names(cache=True):
        return sorted(p.name for p in module_sources(scripts / "s.py", package, cache=cache))

    def names_in_a_new_process():
        code = (
            "import sys; from pathlib import Path; from epochlens.provenance import module_sources\n"
            f"print(sorted(p.name for p in module_sources(Path({str(scripts / 's.py')!r}), "
            f"Path({str(package)!r}))))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return eval(out.stdout)

    assert names() == names(cache=False) == ["a.py", "b.py"]
    assert (package / "__pycache__" / "module_sources.json").is_file()
    assert names_in_a_new_process() == ["a.py", "b.py"]
    (package / "b.py").write_text("from epochlens.c import y\nx = 1\n")
    assert names() == names(cache=False) == ["a.py", "b.py", "c.py"]
    (package / "b.py").write_text("from epochlens.d import y\nx = 1\n")  # d does not exist yet
    assert names() == ["a.py", "b.py"]
    (package / "d.py").write_text("y = 3\n")  # a new module: the import now resolves
    assert names() == ["a.py", "b.py", "d.py"] == names_in_a_new_process()


def test_cached_module_sources_of_the_real_scripts_are_the_parsed_ones():
    scripts = PACKAGE_DIR.parents[1] / "scripts"
    for script in sorted(scripts.glob("[!_]*.py")):
        assert module_sources(script) == module_sources(script, cache=False), script.name
