"""Sphinx configuration of genvi's documentation site (Sphinx with myst-nb and furo).

    pip install -e ".[docs]"
    sphinx-build -W --keep-going -b html docs docs/_build/html   # then open docs/_build/html/index.html

The site is the Markdown pages in docs/ (every one, found by the glob in index.md), the
README as the landing page, the notebooks in notebooks/ rendered from their committed
outputs (never executed here), and an API reference generated from the docstrings of
every name in `genvi.__all__`. Two things are generated at each build, both ignored by
git: `docs/notebooks/` (copies of the notebooks, since Sphinx reads only files under
docs/) and `docs/_generated/api_reference.md` (the reference's directives, one per
public name, so a name added to `genvi.__all__` appears without editing anything here).
"""

from __future__ import annotations

import inspect
import pathlib
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import genvi  # noqa: E402 - after the checkout is on the path

project = "genvi"
author = "the genvi authors"
release = version = genvi.__version__
copyright = "the genvi authors, Apache-2.0"  # noqa: A001 - Sphinx's name

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.autosummary",
              "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]

# notebooks: rendered from the outputs committed with them; the test command runs them
nb_execution_mode = "off"
# GitHub-style heading anchors, so the pages' links such as objectives.md#reading-... resolve
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# the code's docstrings are Google style (Args:, Returns:, Example:)
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autosummary_generate = False  # the reference page is generated below, not stub files

html_theme = "furo"
html_title = f"genvi {release}"

# the public names grouped by the layer that defines them (genvi/<layer>/...)
SECTIONS = {
    "gen": "Generative programs",
    "distributions": "Distributions",
    "adev": "Gradient strategies and expectations",
    "objectives": "Objectives",
    "inference": "Inference",
    "guides": "Automatic guides and constrained parameters",
    "training": "Training",
    "interop": "NumPyro programs",
    "core": "Core: choice maps, errors and validation",
}


def copy_notebooks() -> None:
    """Copy notebooks/NN_*.ipynb into docs/notebooks/, skipping unchanged ones (so an
    incremental build rereads only what changed) and removing ones no longer there."""
    target = DOCS / "notebooks"
    target.mkdir(exist_ok=True)
    sources = {p.name: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    for stale in set(p.name for p in target.glob("*.ipynb")) - set(sources):
        (target / stale).unlink()
    for name, source in sources.items():
        copy = target / name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)


def _layer(obj: object) -> str:
    """The genvi subpackage (layer) that defines `obj`."""
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    if not isinstance(module, str) or not module.startswith("genvi."):
        module = type(obj).__module__  # an instance, such as gv.REPARAM
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "core"


def _directive(name: str, obj: object) -> str:
    if inspect.ismodule(obj):  # its members that are public names too are documented once
        shared = sorted(n for n, v in vars(obj).items()
                        if any(v is getattr(genvi, p) for p in genvi.__all__ if p != name))
        return (f".. automodule:: genvi.{name}\n   :members:\n"
                + (f"   :exclude-members: {', '.join(shared)}\n" if shared else ""))
    if inspect.isclass(obj):
        return f".. autoclass:: genvi.{name}\n   :members:\n"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return f".. autofunction:: genvi.{name}\n"
    return f".. autodata:: genvi.{name}\n   :no-value:\n"


def api_reference() -> str:
    """The API reference's Markdown: per layer, a summary table of its names in
    genvi.__all__, then each name's documentation."""
    names = sorted(set(genvi.__all__), key=lambda n: (n.lower(), n))
    grouped: dict[str, list[str]] = {layer: [] for layer in SECTIONS}
    for name in names:
        grouped.setdefault(_layer(getattr(genvi, name)), []).append(name)
    lines = []
    for layer, members in grouped.items():
        if not members:
            continue
        lines += [f"## {SECTIONS.get(layer, layer)}", "", "```{eval-rst}",
                  ".. currentmodule:: genvi", "", ".. autosummary::", "   :nosignatures:", ""]
        lines += [f"   {name}" for name in members] + [""]
        lines += [_directive(name, getattr(genvi, name)) for name in members]
        lines += ["```", ""]
    return "\n".join(lines)


def generate(app: object) -> None:
    """Before Sphinx reads the sources: the notebooks' copies and the API reference
    (rewritten only when it changed, so an incremental build stays incremental)."""
    copy_notebooks()
    out = DOCS / "_generated" / "api_reference.md"
    out.parent.mkdir(exist_ok=True)
    text = api_reference()
    if not out.exists() or out.read_text() != text:
        out.write_text(text)


def setup(app: object) -> None:
    app.connect("builder-inited", generate)
