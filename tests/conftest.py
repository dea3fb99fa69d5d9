"""Test-wide settings: experiments run through `genvi.cli.main` in tests do not write
JAX's persistent compilation cache (a user's `genvi run` does; see
`genvi.core.compile_cache.use_compilation_cache`); the longest test modules run first;
ArviZ, where installed, is imported the way genvi imports it."""

import os

os.environ["GENVI_CACHE"] = "off"

# ArviZ 1.x leaves a lazy stand-in for NumPyro in sys.modules when it is imported
# (test_arviz.py imports it at collection), and a later `import numpyro.distributions`
# then fails half-built; genvi's own import of ArviZ loads the stand-in at once, so
# the order in which workers run the tests does not matter.
try:
    from genvi.inference.arviz_versions import require_arviz
    require_arviz("the tests")
except ImportError:
    pass

# Modules whose tests run for tens of seconds each (notebooks, experiments, AIR, docs,
# two processes) are handed out first, so that `pytest -n 2` does not end with one
# worker busy on a long test while the other idles.
_LONG_FIRST = ("test_notebooks.py", "test_experiments.py", "test_air.py", "test_docs.py",
               "test_distributed.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in _LONG_FIRST)
