"""Sphinx configuration: the Markdown pages of docs/ (MyST), the API reference from the
docstrings (autodoc) and the configuration page from ``flask_defer.config.DEFAULTS``.

``make docs`` builds it into ``docs/_build/html`` with warnings as errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "_ext"))

project = "flask_defer"
author = "flask_defer developers"
copyright = "flask_defer developers"  # noqa: A001 - Sphinx's name

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "defer_config",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "screenshots"]
myst_enable_extensions = ["colon_fence", "deflist"]
# Pages link to each other's sections as page.md#section-title.
myst_heading_anchors = 4
html_theme = "furo"
html_title = "flask_defer"
# A page of the repository outside docs/ (README.md, demo_app/, tests/) is linked as
# a file of the repository, which Sphinx does not build: not a broken reference.
suppress_warnings = ["myst.xref_missing"]

autodoc_member_order = "groupwise"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
