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
# Pages that other branches add (guides/dossier.md, guides/samples.md, reliability.md) are in the
# toctrees as glob patterns: until they exist, a pattern that matches nothing is not a warning.
suppress_warnings = ["toc.empty_glob"]

html_theme = "furo"
html_title = "epochlens"
html_static_path: list[str] = []
html_theme_options = {"source_directory": "docs/", "navigation_with_keys": True}

#: Pages that other branches add, listed in the toctrees (index.md) as glob patterns so that each
#: appears once its file lands. Sphinx warns of a glob that matches nothing and, with -W, fails
#: (this warning has no type that suppress_warnings could name): until a page lands, that one
#: warning is dropped for these patterns only. Once the three pages are merged, replace the patterns
#: in index.md by the page names and delete PENDING_PAGES and setup().
PENDING_PAGES = ("guides/samples*", "guides/dossier*", "reliability*")


def _not_pending(record) -> bool:
    message = record.getMessage()
    return not ("didn't match any documents" in message and any(repr(p) in message for p in PENDING_PAGES))


def setup(app) -> None:
    import logging

    from sphinx.util.logging import WarningStreamHandler

    for handler in logging.getLogger("sphinx").handlers:
        if isinstance(handler, WarningStreamHandler):
            handler.filters.insert(0, _not_pending)  # before -W turns the warning into an error
