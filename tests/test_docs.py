"""The Python examples in the README and docs run as written."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", ["README.md", "docs/objectives.md", "docs/extending.md",
                                 "docs/neural.md", "docs/sharp_edges.md",
                                 "docs/estimator_lab.md", "docs/dataset_scale.md",
                                 "docs/auto_guides.md", "docs/from_numpyro.md",
                                 "docs/algebra.md"])
def test_python_blocks_run(doc):
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S):
        exec(compile(block, doc, "exec"), namespace)  # noqa: S102 - our own docs
