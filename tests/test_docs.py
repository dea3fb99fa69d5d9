"""The Python examples in the README and docs run as written."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", ["README.md", "docs/objectives.md", "docs/extending.md",
                                 "docs/neural.md", "docs/sharp_edges.md",
                                 "docs/estimator_lab.md", "docs/dataset_scale.md",
                                 "docs/auto_guides.md", "docs/from_numpyro.md",
                                 "docs/algebra.md", "docs/did_it_work.md",
                                 "docs/training.md", "docs/which_estimator.md"])
def test_python_blocks_run(doc):
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S):
        exec(compile(block, doc, "exec"), namespace)  # noqa: S102 - our own docs


def test_api_reference_documents_every_public_name():
    """The site's API reference is generated from genvi.__all__ (docs/conf.py), so a
    new public name appears in it without editing the docs."""
    import importlib.util

    import genvi
    spec = importlib.util.spec_from_file_location("genvi_docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    reference = conf.api_reference()
    documented = set(re.findall(r"^\.\. auto(?:function|class|data|module):: genvi\.(\w+)$",
                                reference, re.M))
    assert documented == set(genvi.__all__)
    # every page in docs/ is on the site: index.md's toctree takes them by a glob
    assert ":glob:\n\n*\n" in (ROOT / "docs" / "index.md").read_text()


def test_the_readme_is_a_front_door():
    """At most about 250 lines, and every page it links to exists (the rest of what
    used to be in it lives in docs/)."""
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= 250
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|ipynb))(?:#[\w-]+)?\)", text)
    assert links and all((ROOT / link).exists() for link in links), [
        link for link in links if not (ROOT / link).exists()]


def test_every_public_function_documents_its_arguments_and_return():
    """Each function `genvi` exports says, in Google style, what every argument is
    (`Args:`, one entry a parameter, `*data` and `**kw` included) and what it returns
    (`Returns:`), as the API reference renders them."""
    import inspect

    import genvi
    missing = {}
    for name in genvi.__all__:
        fn = getattr(genvi, name)
        if not inspect.isfunction(fn):
            continue
        doc = inspect.getdoc(fn) or ""
        params = inspect.signature(fn).parameters.values()
        wanted = [("*" * (p.kind == p.VAR_POSITIONAL) + "**" * (p.kind == p.VAR_KEYWORD)
                   + p.name + ":") for p in params]
        section = doc.split("Args:", 1)[1].split("Returns:", 1)[0] if "Args:" in doc else ""
        gaps = [w for w in wanted if not re.search(rf"^\s+{re.escape(w)}", section, re.M)]
        if "Returns:" not in doc:
            gaps.append("Returns:")
        if gaps:
            missing[name] = gaps
    assert not missing, missing
