"""The persistent XLA compilation cache: on in `genvi run`, in `gv.fit` only when asked.

JAX keeps it off by default, and it is process-wide configuration: turning it on
changes every later compile of the process, NumPyro's and the user's own included.
So a library call turns it on only where the user asked, by naming a folder in
`$GENVI_CACHE`; `genvi run`, a command that owns its process, turns it on by default
so that a second run of an experiment loads its compiled steps instead of compiling
them again. A cache the user configured (`JAX_COMPILATION_CACHE_DIR`, `jax.config`)
is left alone.
"""

from __future__ import annotations

import os

import jax

DEFAULT_FOLDER = os.path.join("~", ".cache", "genvi", "xla")


def use_compilation_cache(by_default: bool = False) -> str | None:
    """Keep compiled steps on disk between runs, so a second run of a script skips
    XLA's compile (AIR's steps take seconds each to compile on a CPU); only compiles
    that took at least a second are kept. Returns the folder, or None if nothing
    changed.

    The folder is `$GENVI_CACHE`; `GENVI_CACHE=off` turns the cache off, and a JAX
    cache configured already (`JAX_COMPILATION_CACHE_DIR`) wins. Where `$GENVI_CACHE`
    is not set, the cache is turned on (at `~/.cache/genvi/xla`) only `by_default`
    (`genvi run`); `gv.fit` passes False, so a library call leaves JAX's configuration
    as it found it unless the user asked.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from genvi.core.compile_cache import use_compilation_cache
        >>> with mock.patch.dict(os.environ, GENVI_CACHE="off"):
        ...     print(use_compilation_cache(by_default=True))
        None
        >>> with mock.patch.dict(os.environ, clear=True):
        ...     print(use_compilation_cache())
        None
    """
    folder = os.environ.get("GENVI_CACHE")
    if folder is None:
        if not by_default:
            return None
        folder = DEFAULT_FOLDER
    if folder.lower() in ("off", "0", "") or jax.config.jax_compilation_cache_dir:
        return None
    folder = os.path.expanduser(folder)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return folder
