"""The persistent XLA compilation cache that `gv.fit` and `genvi run` turn on.

JAX keeps it off by default; genvi turns it on (once per process) so that a second run
of a training script loads its compiled steps instead of compiling them again. A cache
the user configured (`JAX_COMPILATION_CACHE_DIR`, `jax.config`) is left alone.
"""

from __future__ import annotations

import os

import jax


def use_compilation_cache() -> str | None:
    """Keep compiled steps on disk between runs, so a second run of a script (`gv.fit`,
    `genvi run`) skips XLA's compile (AIR's steps take seconds each to compile on a CPU).
    Only compiles that took at least a second are kept.
    The folder is `$GENVI_CACHE`, default `~/.cache/genvi/xla`; `GENVI_CACHE=off`
    turns it off, and a JAX cache configured already (JAX_COMPILATION_CACHE_DIR) wins.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from genvi.core.compile_cache import use_compilation_cache
        >>> with mock.patch.dict(os.environ, GENVI_CACHE="off"):
        ...     print(use_compilation_cache())
        None
    """
    folder = os.environ.get("GENVI_CACHE", os.path.join("~", ".cache", "genvi", "xla"))
    if folder.lower() in ("off", "0", "") or jax.config.jax_compilation_cache_dir:
        return None
    folder = os.path.expanduser(folder)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return folder
