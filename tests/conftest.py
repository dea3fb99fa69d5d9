"""Test-wide settings: experiments run through `genvi.cli.main` in tests do not write
genvi's persistent compilation cache (a user's `genvi run` does; see
`genvi.core.compile_cache.use_compilation_cache`); the longest test modules run first;
ArviZ, where installed, is imported the way genvi imports it.

Compiling is most of the suite's time (XLA compiles each test's programs, which then
run for milliseconds), so the test processes compile them as quickly as XLA can:
* without LLVM's optimizations (`--xla_backend_optimization_level=0`: the same
  programs, the same numbers, 40% less compiling) and without its expensive passes
  (`--xla_llvm_disable_expensive_passes=true`: a further 10%);
  `GENVI_TEST_XLA_OPTIMIZE=1` compiles as users do, and so do the long fits that
  tests run in processes of their own (`programs.optimized_env`);
* once per program: the test processes (both `pytest -n` workers) share a JAX
  compilation cache in `.pytest_xla_cache/` (ignored by git), so a program two tests
  build alike compiles once; `GENVI_TEST_XLA_CACHE=off` turns it off.

A test process's heap grows to millions of objects (JAX's caches of traced and
compiled programs), and Python's full garbage collections walk all of them again and
again: after each test, one collection over what that test made and `gc.freeze()`, so
later collections skip what outlives it (measured: the collector's time in a run of
four estimator modules from 9.2 s to 2.7 s, the run 8% shorter, peak memory the same).
"""

import gc
import os
import pathlib

os.environ["GENVI_CACHE"] = "off"

import jax  # noqa: E402
import pytest  # noqa: E402
from programs import UNOPTIMIZED_FLAGS  # noqa: E402

# XLA reads XLA_FLAGS when a process's backend starts: these processes and the ones
# they start (notebooks' kernels, compiling helpers) compile alike
_UNOPTIMIZED = os.environ.get("GENVI_TEST_XLA_OPTIMIZE") != "1" \
    and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
if _UNOPTIMIZED:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + " ".join(
        UNOPTIMIZED_FLAGS)).strip()

if os.environ.get("GENVI_TEST_XLA_CACHE", "").lower() not in ("off", "0"):
    # programs compiled with and without the optimizations, in folders apart
    _folder = "unoptimized" if _UNOPTIMIZED else "optimized"
    jax.config.update("jax_compilation_cache_dir", str(
        pathlib.Path(__file__).resolve().parents[1] / ".pytest_xla_cache" / _folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)

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
_LONG_FIRST = ("test_notebooks.py", "test_experiments.py", "test_fit_tuning.py", "test_air.py",
               "test_checkpoint_faults.py", "test_docs.py", "test_markov_replays.py",
               "test_lane_local.py", "test_distributed.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in _LONG_FIRST)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    # after the test's fixtures are torn down: its garbage collected, what outlives it
    # (caches, modules) out of every later collection's walk
    gc.collect()
    gc.freeze()
