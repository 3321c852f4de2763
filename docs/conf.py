"""Sphinx configuration of the epochlens docs (docs/about.md says why Sphinx, MyST and Furo).

Build: ``.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html`` (``make docs``);
tests/docs/test_docs.py builds it with warnings as errors, so CI fails on a broken link or page.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

project = "epochlens"
author = "the epochlens authors"
copyright = "the epochlens authors"  # noqa: A001 - Sphinx's name

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_tools", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "epochlens"
html_static_path: list[str] = []
html_theme_options = {"source_directory": "docs/", "navigation_with_keys": True}
