"""Which library files a script depends on, and provenance records."""

from __future__ import annotations

import hashlib

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
    found = _found(tmp_path, "from epochlens.influence import InfluenceSettings\n")
    assert {"influence/__init__.py", "influence/settings.py", "influence/scores.py"} <= found


def test_table_provenance_hashes_inputs(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("x\n1\n")
    record = table_provenance({"k": 1}, [a], ["t.csv"])
    assert record["tables"] == ["t.csv"]
    assert record["inputs"] == file_digests([a])
    assert record["inputs"][str(a)] == "sha256:" + hashlib.sha256(b"x\n1\n").hexdigest()
    assert set(record) >= {"code", "config_hash", "packages"}
