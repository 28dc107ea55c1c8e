"""Sphinx configuration of slowlink's API reference: `sphinx-build -W -b html docs/api OUT` (the docs
extra installs Sphinx). Every page is generated from the docstrings; warnings are errors."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

project = "slowlink"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures say enough; forward references would only warn
autodoc_default_options = {"members": True}
highlight_language = "none"  # docstrings are prose, not code
html_theme = "alabaster"
html_theme_options = {"page_width": "1180px", "body_max_width": "none"}
html_static_path = ["_static"]
html_css_files = ["slowlink.css"]
exclude_patterns = ["_build"]
suppress_warnings = ["ref.python"]  # names re-exported by `slowlink` and defined in submodules


def _as_written(app, what, name, obj, options, lines):
    """slowlink's docstrings are plain text (equations, trees, tables), not reStructuredText: show each
    as it is written, in a literal block, rather than guess at its markup."""
    if any(line.strip() for line in lines):
        lines[:] = [".. code-block:: none", ""] + [f"    {line}" for line in lines] + [""]


def setup(app):
    app.connect("autodoc-process-docstring", _as_written)
