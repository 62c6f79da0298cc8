# Sphinx configuration of kfuse's API reference (scripts/build-docs.sh builds it with -W
# --keep-going: every warning fails the build). The C reference comes from Doxygen's XML of
# kfuse.h through breathe, the Python reference from the package's docstrings (autodoc; the
# package must be importable: build-docs.sh puts a build of it on sys.path), the per-op math from
# docs/ops/*.md (included through myst_parser, never copied), the Rust reference from rustdoc
# (linked: build-docs.sh writes it beside the HTML, in ../rust).
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # kfdocs.py, the kf-calls directive

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("KF_DOCS_OUT", ROOT / "build/docs"))

_header = (ROOT / "capi/include/kfuse.h").read_text()
project = "kfuse"
copyright = "the kfuse authors"
release = ".".join(re.search(r"#define KF_VERSION_%s (\d+)" % p, _header).group(1)
                   for p in ("MAJOR", "MINOR", "PATCH"))
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.extlinks", "breathe", "myst_parser",
              "kfdocs"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["snippets"]
nitpicky = False

breathe_projects = {"kfuse": str(OUT / "doxygen/xml")}
breathe_default_project = "kfuse"
breathe_domain_by_extension = {"h": "c"}
primary_domain = "c"

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# torch's own docstrings (inherited members of nn.Module) are torch's, not ours
autodoc_inherit_docstrings = False

# {rust}`kfuse::RnnPlan <kfuse/struct.RnnPlan.html>`: a page of the rustdoc output beside this one
extlinks = {"rust": ("../rust/%s", "%s")}

myst_heading_anchors = 3


def plain_docstring(app, what, name, obj, options, lines):
    """The package's docstrings are plain text (aligned columns, formulas, `code`), not
    reStructuredText: show each one as written, in a literal block."""
    if any(line.strip() for line in lines):
        lines[:] = [".. code-block:: text", ""] + ["    " + line for line in lines] + [""]


def setup(app):
    app.connect("autodoc-process-docstring", plain_docstring)


html_theme = "alabaster"
html_theme_options = {"description": "fused CPU/CUDA kernels behind a stable C ABI",
                      "page_width": "1100px", "body_max_width": "none"}
html_static_path = []
