"""The docs site (docs/): it builds with warnings as errors, its generated reference pages are those
the code gives today, every config key has a description and appears in the reference, and every
tutorial's config is valid and dry-run by a workflow test."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epochlens import config as run_config

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SCHEMA = REPO / "config" / "schema.yaml"
#: Each tutorial's config, and the workflow test that plans or runs it (so it stays valid).
TUTORIALS = {
    "lop-cifar100.md": ("config/cifar100_lop.yaml", "workflow/test_lop_study.py"),
    "poisons-in-text-models.md": (
        "config/examples/text_to_text.yaml",
        "workflow/test_text_to_text_workflow.py",
    ),
    "stored-activations.md": ("config/examples/stored_activations.yaml", "workflow/test_stored_workflow.py"),
    "causal-lm-heads.md": ("config/examples/causal_lm.yaml", "workflow/test_causal_lm_workflow.py"),
    "own-training-script.md": (
        "config/examples/own_training.yaml",
        "workflow/test_train_command_workflow.py",
    ),
}


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "_tools" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_without_a_warning(tmp_path):
    pytest.importorskip("sphinx", reason="the dev extra (pip install -e '.[dev]') installs Sphinx")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reference" / "config.html").exists()


def test_the_generated_reference_pages_are_current():
    assert generator().main(["--check"]) == 0, "run: python docs/_tools/generate.py, and commit the pages"


def test_every_config_key_is_described_and_in_the_reference():
    gen = generator()
    schema = yaml.safe_load(SCHEMA.read_text())
    assert gen.undescribed(schema) == []
    page = (DOCS / "reference" / "config.md").read_text()
    keys = [key for key, _ in gen.config_keys(schema) if not key.endswith(("<run>", "[]"))]
    assert len(keys) > 200
    missing = [key for key in keys if f"**`{_label(key)}`**" not in page]
    assert missing == []


def _label(key: str) -> str:
    """How the reference writes a key: within its section (``n_directions`` of runs.<run>.curvature)."""
    parts = key.replace("[]", "").split(".")
    if parts[:2] == ["runs", "<run>"]:
        rest = parts[2:]
        return rest[0] if len(rest) == 1 else ".".join(rest[1:])
    return parts[-1] if len(parts) > 1 else parts[0]


def test_a_key_without_a_description_fails_the_generator():
    gen = generator()
    schema = {"properties": {"device": {"type": "string"}, "runs": {"type": "object", "description": "x"}}}
    assert gen.undescribed(schema) == ["device"]


@pytest.mark.parametrize("page", sorted(TUTORIALS))
def test_each_tutorial_shows_a_valid_config_that_a_workflow_test_plans(page):
    config, test = TUTORIALS[page]
    text = (DOCS / "tutorials" / page).read_text()
    assert f"```{{literalinclude}} ../../{config}" in text  # the file itself, not a copy that drifts
    assert config.split("/")[-1] in (REPO / "tests" / test).read_text()
    run_config.fill_defaults(yaml.safe_load((REPO / config).read_text()), SCHEMA)  # schema-valid


def test_every_page_is_in_a_toctree():
    """Every page is listed by name, or by a glob pattern."""
    from fnmatch import fnmatchcase

    index = (DOCS / "index.md").read_text()
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")}
    pages = {p for p in pages if not p.startswith(("_", "index"))}
    entries = re.findall(r"^([a-z][\w/*-]*)$", index, flags=re.M)
    assert {p for p in pages if not any(fnmatchcase(p, e) for e in entries)} == set()


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    first = readme.split("```")[1]
    assert first.startswith("bash\nmake demo") and "\nmake test" in first
    links = re.findall(r"\]\((docs/[^)#]+|CHANGELOG\.md)", readme)
    assert [link for link in links if not (REPO / link).exists()] == []
    assert (REPO / "docs" / "images" / "polarity_ablation_effect.png").exists()
